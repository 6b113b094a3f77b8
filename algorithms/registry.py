"""Name -> algorithm. Modules are imported lazily so a broken optional one cannot break all."""

from __future__ import annotations

import importlib

from algorithms.base import Algorithm

_MODULES: dict[str, str] = {
    "fedmc-admm": "algorithms.fedmc_admm",
    "fedmavg": "algorithms.fedmavg",
    "fedmgs": "algorithms.fedmgs",
    "rfrec": "algorithms.rfrec",
    "rfrecf": "algorithms.rfrecf",
    "felb": "algorithms.felb",
    "felb-mu": "algorithms.felb_mu",
    "binary-baseline": "algorithms.binary_baseline",
    "dpals": "algorithms.dpals",
    "dp-fedmavg": "algorithms.dp_fedmavg",
    "dp-fedmc-admm": "algorithms.dp_fedmc_admm",
    "ials": "algorithms.ials",
    "dp-ials": "algorithms.ials",
}


#: ranking models: they learn which items users choose and serve top-k lists; every other
#: registered algorithm is a rating model (it predicts values; RMSE reports)
RANKING: frozenset[str] = frozenset({"ials", "dp-ials"})


def model_kind(name: str) -> str:
    """"ranking" for a model that serves top-k lists, else "rating" (it predicts values)."""
    return "ranking" if name in RANKING else "rating"


def names() -> list[str]:
    """Registered algorithm names whose module is present."""
    return [n for n, m in _MODULES.items() if importlib.util.find_spec(m) is not None]


def get(name: str) -> Algorithm:
    """The algorithm registered as ``name``; its module exposes ``ALGORITHM``."""
    if name not in _MODULES:
        raise KeyError(f"unknown algorithm {name!r}; known: {', '.join(names())}")
    module = importlib.import_module(_MODULES[name])
    alg = getattr(module, "ALGORITHMS", {}).get(name) or module.ALGORITHM
    return alg


def user_releases(cfg: object, rounds: int) -> int:
    """Releases each user of a user-level run takes part in: DPALS's ``sweeps``, the
    gradient methods' ``releases`` (both stop uploading after them), else ``rounds``."""
    for field in ("sweeps", "releases"):
        if hasattr(cfg, field):
            return int(getattr(cfg, field))
    return int(rounds)


def user_bounds(name: str, cfg: object) -> object | None:
    """The per-user bounds an algorithm declares for user-level DP (its module's
    ``user_bounds(cfg)``), or None if its uploads are not sums of bounded per-user terms."""
    get(name)  # unknown names raise here
    fn = getattr(importlib.import_module(_MODULES[name]), "user_bounds", None)
    return None if fn is None else fn(cfg)
