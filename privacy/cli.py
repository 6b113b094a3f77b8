"""Command-line options of differential privacy, shared by ``fedrec simulate`` and the service.

Defaults give a meaningful guarantee: with ``--dp gaussian`` (the default of
:func:`add_dp_arguments`; ``fedrec simulate`` passes ``none``) or ``--dp laplace`` and no
noise option, the noise is solved so that every tenant spends at most
``DEFAULT_EPSILON`` over the whole run (worst case: it transmits in every round), at
delta = min(1e-5, 1 / number of users), protecting its whole rating block; the budget is
set to the same epsilon, so the ledger stops any tenant that would exceed it.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Hashable, Mapping

from privacy.accountant import noise_for_epsilon
from privacy.ledger import Budget, Ledger, worst_case_plan
from privacy.release import Release, release_of, transmission_plan
from privacy.wrapper import DPPrivatizer, DPSpec

DEFAULT_EPSILON = 8.0
DEFAULT_DELTA = 1e-5


def add_dp_arguments(parser: argparse.ArgumentParser, *, default: str = "gaussian"
                     ) -> argparse.ArgumentParser:
    """Add ``--dp``, ``--dp-norm``, ``--dp-clip``, the noise options, ``--dp-delta``, budget."""
    g = parser.add_argument_group("differential privacy (unit: a tenant's whole rating block)")
    g.add_argument("--dp", choices=["none", "laplace", "gaussian", "bernoulli"],
                   default=default,
                   help=f"noise mechanism on every upload (default: {default}); bernoulli = "
                        "XOR noise for Boolean uploads (e.g. the binary baseline's), no clip")
    g.add_argument("--dp-norm", choices=["l2", "l1", "value"], default=None,
                   help="clip: L2 norm, L1 norm or element-wise value clip (RFRec eq. 9); "
                        "default l2 for gaussian, l1 for laplace")
    g.add_argument("--dp-clip", type=float, default=1.0,
                   help="clip bound C of the whole upload (entry bound for value; default 1)")
    noise = g.add_mutually_exclusive_group()
    noise.add_argument("--dp-noise", type=float, default=None,
                       help="noise multiplier: sigma (gaussian) or b (laplace) / sensitivity 2C")
    noise.add_argument("--dp-scale", type=float, default=None,
                       help="absolute per-entry noise sigma or b (e.g. RFRec's s)")
    noise.add_argument("--dp-flip-prob", type=float, default=None,
                       help="bernoulli: flip probability p of every bit, 0 < p < 0.5 "
                            "(epsilon per transmission = d ln((1-p)/p) over d bits)")
    noise.add_argument("--dp-epsilon", type=float, default=None,
                       help="target epsilon per tenant over the whole run; the noise is solved "
                            f"for it (default when no noise option is given: {DEFAULT_EPSILON})")
    g.add_argument("--dp-delta", type=float, default=None,
                   help="delta (default: min(1e-5, 1 / number of users))")
    g.add_argument("--budget-epsilon", type=float, default=None,
                   help="each tenant's epsilon_max (default: the target epsilon when the noise "
                        "is solved for one, else unlimited)")
    return parser


def default_delta(n_users: int | None) -> float:
    """min(1e-5, 1 / n_users): below one over the population, as DP requires."""
    return DEFAULT_DELTA if not n_users else min(DEFAULT_DELTA, 1.0 / n_users)


def sampling_plan(n_clients: int, rounds: int, per_round: int, seed: int) -> dict[str, int]:
    """Exact transmissions per tenant under the default sampling (``default_select``):
    :func:`privacy.release.transmission_plan` keyed by tenant as the ledger is. Tenants
    never selected are listed with 0."""
    return {str(i): n for i, n in transmission_plan(n_clients, rounds, per_round, seed).items()}


def spec_from_args(args: argparse.Namespace, transmissions: int, n_users: int | None = None
                   ) -> tuple[DPSpec, float | None]:
    """The DP spec of ``args`` and the target epsilon it was solved for (None if not solved)."""
    if args.dp == "none":
        return DPSpec(mechanism="none"), None
    delta = args.dp_delta if args.dp_delta is not None else default_delta(n_users)
    common = dict(mechanism=args.dp, norm=args.dp_norm, clip=args.dp_clip, delta=delta)
    flip = getattr(args, "dp_flip_prob", None)
    if flip is not None and args.dp != "bernoulli":
        raise ValueError("--dp-flip-prob applies to --dp bernoulli only")
    if args.dp == "bernoulli":
        if args.dp_scale is not None:
            raise ValueError("--dp bernoulli has no noise scale: give --dp-flip-prob, "
                             "--dp-noise or --dp-epsilon")
        if flip is not None:
            return DPSpec(flip_prob=flip, **common), None
    if args.dp_noise is not None:
        return DPSpec(noise_multiplier=args.dp_noise, **common), None
    if args.dp_scale is not None:
        return DPSpec(noise_scale=args.dp_scale, **common), None
    target = args.dp_epsilon if args.dp_epsilon is not None else DEFAULT_EPSILON
    z = noise_for_epsilon(args.dp, target, delta, max(transmissions, 1))
    return DPSpec(noise_multiplier=z, **common), target


def privatizer_from_args(args: argparse.Namespace, n_clients: int, rounds: int, seed: int, *,
                         n_users: int | None = None, plan: Mapping[Hashable, int] | None = None,
                         ledger: Ledger | None = None, n_entries: int | None = None
                         ) -> DPPrivatizer:
    """A :class:`DPPrivatizer` for a run of ``rounds`` rounds over ``n_clients`` tenants.

    ``plan`` maps tenant -> planned transmissions (default: worst case, every round);
    ``ledger`` carries earlier spend (default: a fresh one with ``--budget-epsilon``).
    Raises ``BudgetExceeded`` (a ``ValueError``) before the run if a planned tenant would
    exceed its budget. Call ``.report()`` on the result after the run.
    """
    plan = dict(plan) if plan is not None else worst_case_plan(range(n_clients), rounds)
    spec, target = spec_from_args(args, max(plan.values(), default=rounds), n_users)
    if ledger is None:
        cap = args.budget_epsilon if args.budget_epsilon is not None else target
        budget = Budget(math.inf if cap is None else cap, spec.delta if spec.mechanism != "none"
                        else default_delta(n_users))
        ledger = Ledger.open({i: budget for i in range(n_clients)})
    priv = DPPrivatizer(spec, ledger, seed)
    priv.check_plan(plan, n_entries)
    return priv


DEFAULT_USER_DELTA = 1e-6


def add_privacy_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--privacy`` (the unit), ``--placement``, ``--epsilon`` and ``--delta``."""
    g = parser.add_argument_group("privacy unit (user-level DP: one user account of one "
                                  "tenant; or the tenant's whole block)")
    g.add_argument("--privacy", choices=["none", "user", "tenant"], default=None,
                   help="unit protected: 'user' (one user account of one tenant; needs an "
                        "algorithm with per-user bounded uploads: dpals, dp-fedmavg, "
                        "dp-fedmc-admm), 'tenant' "
                        "(a tenant's whole block: the --dp wrapper) or 'none' (default; "
                        "'tenant' when a --dp mechanism is given)")
    g.add_argument("--placement", choices=["central", "tenant"], default=None,
                   help="user unit: where the noise is added: 'central' (once, to the sum "
                        "of the tenants' bounded uploads; default) or 'tenant' (each tenant "
                        "noises its own upload: T times the variance)")
    g.add_argument("--epsilon", type=float, default=None,
                   help=f"target epsilon over the whole run (default {DEFAULT_EPSILON}); "
                        "for the tenant unit the same as --dp-epsilon")
    g.add_argument("--delta", type=float, default=None,
                   help=f"delta (user unit default: {DEFAULT_USER_DELTA:g}, below 1 / users; "
                        "tenant unit: as --dp-delta)")
    g.add_argument("--release-growth", type=float, default=None,
                   help="user unit: release k gets a privacy share proportional to g^k "
                        "(later, less noisy releases; 1 = equal; default 2.5)")
    g.add_argument("--secure-aggregation", action="store_true",
                   help="the coordinator sees only the sum of the uploads (pairwise-masked, "
                        "Bonawitz et al. CCS 2017); with --privacy user --placement tenant "
                        "each tenant adds 1/sqrt(t) of the noise (distributed DP, central "
                        "accuracy); with --privacy none a noise-free secure sum")
    g.add_argument("--dropout-tolerance", type=float, default=None,
                   help="secure aggregation: largest fraction of a round's tenants that may "
                        "drop (default 0.1; noise is planned for the remaining t)")
    g.add_argument("--gram-share", type=float, default=None,
                   help="user unit: share of each release's privacy spent on the Gram "
                        "matrices, the rest on the right-hand sides (default 0.2)")
    return parser


def privacy_unit(args: argparse.Namespace) -> str:
    """The unit selected by ``--privacy`` and ``--dp`` ('none', 'user' or 'tenant').

    ``--dp`` alone keeps its meaning (the tenant unit); ``--privacy tenant`` without a
    mechanism uses the Gaussian one; ``--epsilon``/``--delta`` fill the ``--dp-*`` options.
    Contradictions raise ``ValueError`` naming the flags.
    """
    unit = args.privacy or ("tenant" if args.dp != "none" else "none")
    if unit != "tenant" and args.dp != "none":
        raise ValueError(f"--dp {args.dp} protects a tenant's whole block: it cannot be "
                         f"combined with --privacy {unit}")
    if unit != "user" and args.placement is not None:
        raise ValueError("--placement applies to --privacy user only (the tenant unit is "
                         "always noised by each tenant)")
    for flag in ("gram_share", "release_growth"):
        if unit != "user" and getattr(args, flag) is not None:
            raise ValueError(f"--{flag.replace('_', '-')} applies to --privacy user only")
    secure = getattr(args, "secure_aggregation", False)
    if secure and unit == "tenant":
        raise ValueError("--secure-aggregation applies to --privacy user --placement tenant "
                         "or --privacy none (the tenant unit noises each upload in full)")
    if secure and unit == "user" and args.placement != "tenant":
        raise ValueError("--secure-aggregation needs --placement tenant (central placement "
                         "already noises one sum)")
    if getattr(args, "dropout_tolerance", None) is not None and not secure:
        raise ValueError("--dropout-tolerance applies to --secure-aggregation only")
    if unit == "none" and (args.epsilon is not None or args.delta is not None):
        raise ValueError("--epsilon/--delta need --privacy user or tenant")
    if unit == "tenant":
        if args.dp == "none":
            args.dp = "gaussian"
        for mine, theirs in (("epsilon", "dp_epsilon"), ("delta", "dp_delta")):
            if getattr(args, mine) is not None:
                if getattr(args, theirs) is not None:
                    raise ValueError(f"give --{mine} or --{theirs.replace('_', '-')}, "
                                     "not both")
                setattr(args, theirs, getattr(args, mine))
    return unit


def user_privatizer_from_args(args: argparse.Namespace, bounds, releases: int, n_clients: int,
                              n_users: int, seed: int, selection_share: float = 0.0):
    """A :class:`privacy.user_level.UserLevelPrivatizer` for ``--privacy user``
    (``selection_share`` > 0: the job's budget also plans a selection release,
    :mod:`privacy.selection`)."""
    from pydantic import ValidationError

    from privacy.user_level import UserLevelPrivatizer, UserLevelSpec, to_settings

    delta = args.delta if args.delta is not None else min(DEFAULT_USER_DELTA,
                                                          0.1 / n_users)
    try:
        spec = UserLevelSpec(
            epsilon=args.epsilon if args.epsilon is not None else DEFAULT_EPSILON,
            delta=delta, n_users=n_users, releases=releases,
            placement=args.placement or "central", sample_rate=bounds.sample_rate,
            secure_aggregation=bool(getattr(args, "secure_aggregation", False)),
            selection_share=selection_share,
            **{**({} if bounds.release_growth is None else
                  {"release_growth": bounds.release_growth}),
               **{k: getattr(args, k) for k in ("gram_share", "release_growth",
                                                "dropout_tolerance")
                  if getattr(args, k, None) is not None}})
    except ValidationError as exc:  # one line naming the flag, not pydantic's dump
        err = exc.errors()[0]
        field = str(err["loc"][0]).replace("_", "-") if err["loc"] else ""
        msg = err["msg"].removeprefix("Value error, ")
        raise ValueError(f"--{field}: {msg}" if field else msg) from None
    if release_of(to_settings(spec)) is Release.USER_SECURE:
        from privacy.distributed import SecureAggregationPrivatizer

        return SecureAggregationPrivatizer(spec, bounds, n_clients, seed)
    return UserLevelPrivatizer(spec, bounds, n_clients, seed)
