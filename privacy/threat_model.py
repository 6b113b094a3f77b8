"""Who learns what about a user, at what epsilon: the one statement of the threat model.

Every privacy report (``fedrec simulate --json``, a job's and a tenant's report) carries
:func:`threat_model` for its placement, and docs/explanation/privacy.md shows
:func:`markdown_table` verbatim (a test keeps the two equal), so a claim is made once.

The unit is :data:`UNIT`: one user account of one tenant. Neighbouring datasets differ by
all the ratings of one account; a person with accounts in k tenants is k units, protected
by group privacy at k times the epsilon (Dwork and Roth, "The Algorithmic Foundations of
Differential Privacy", Theorem 2.2 for pure DP; for (epsilon, delta) the delta grows to
``k e^((k-1) epsilon) delta``). A guarantee for a tenant's whole block (the tenant unit)
implies the same guarantee for every account in it, so the table holds for both units.

What a differentially private job publishes, and why each is covered:

* the item matrix V, the released centre and biases: the Gaussian releases charged to the
  ledger (:mod:`privacy.user_level`, :mod:`privacy.wrapper`);
* the catalogue the job trains and serves: the items an admin registered, public by
  construction; items created by an upload (``auto_create_items``) are left out;
* a user's list: the user's own factor, solved from the user's own ratings and V, times
  V; a cold-start list folds the user's own ratings into the released V the same way
  (post-processing);
* reports: the charged epsilons, the public inputs (:data:`privacy.user_level.
  PUBLIC_INPUTS`) and figures of the tenant's own evaluation.
"""

from __future__ import annotations

import math
from typing import Any

#: the unit every claim is made for
UNIT = "one user account of one tenant"
UNIT_DETAIL = (
    "unit: one user account of one tenant (add or remove all ratings of that account). A "
    "person with accounts in k tenants is k units: group privacy protects them at k times "
    "the epsilon (delta grows to k e^((k-1) epsilon) delta)")

#: what a tenant's lifetime epsilon (one ledger of tenant- and user-unit charges) bounds
LEDGER_UNIT = (
    "each tenant's ledger composes every charge made to it: a tenant-unit charge (any "
    "block replaced by any other) also bounds each user account in the block, so once a "
    "user-level charge is in it the lifetime epsilon is for one user account of one tenant; "
    "a person with accounts in k tenants is k units, one in each tenant's ledger")

PLACEMENTS = ("central", "tenant", "tenant+secure_aggregation")
ADVERSARIES = ("operator/coordinator", "other tenants", "agents",
               "other users of the same tenant", "whoever sees user u's own list")

#: the epsilon a cell states: the job's charged epsilon, none (trusted), or a formula
CHARGED = "the charged epsilon"
TRUSTED = "none (trusted)"
COALITION = "the charged epsilon, noise multiplier z sqrt((T' - c) / t) against c colluders"

_SEES_LIST = ("u's list is computed from u's own ratings and V, so it shows u's own "
              "ratings' effect (unprotected against this viewer); about any other account: "
              "V and the catalogue only")
_OTHER_USERS = ("their own lists (their ratings and V; a cold-start list folds their own "
                "ratings into V); nothing computed from other accounts' raw ratings")
_OTHER_TENANTS = "V, the released centre and biases, the registered catalogue, reports"

#: placement -> adversary -> (what it learns about user u, at what epsilon)
THREAT_MODEL: dict[str, dict[str, tuple[str, str]]] = {
    "central": {
        "operator/coordinator": ("hosted tenants' raw ratings and every tenant's un-noised "
                                 "bounded sums", TRUSTED),
        "other tenants": (_OTHER_TENANTS, CHARGED),
        "agents": ("nothing: a job with agents is refused at placement central", "n/a"),
        "other users of the same tenant": (_OTHER_USERS, CHARGED),
        "whoever sees user u's own list": (_SEES_LIST, CHARGED),
    },
    "tenant": {
        "operator/coordinator": ("hosted tenants' raw ratings; an agent's noisy uploads "
                                 "only", CHARGED + " (agents' users; hosted: trusted)"),
        "other tenants": (_OTHER_TENANTS, CHARGED),
        "agents": ("the manifest (registered catalogue, settings) and V each round",
                   CHARGED),
        "other users of the same tenant": (_OTHER_USERS, CHARGED),
        "whoever sees user u's own list": (_SEES_LIST, CHARGED),
    },
    "tenant+secure_aggregation": {
        "operator/coordinator": ("the noisy sum of the surviving agents' masked uploads and "
                                 "who took part and dropped", COALITION),
        "other tenants": (_OTHER_TENANTS + "; encrypted shares only", COALITION),
        "agents": ("the manifest, V each round, encrypted shares", COALITION),
        "other users of the same tenant": (_OTHER_USERS, CHARGED),
        "whoever sees user u's own list": (_SEES_LIST, CHARGED),
    },
}

#: what the table does not cover, stated with it
NOT_COVERED = (
    "Not private (epsilon = infinity, stated in every report of the tenants concerned): a "
    "job without noise or with an algorithm whose uploads reveal ratings; a tuning job "
    "(it trains and scores on raw ratings); a model trained by either serves lists and "
    "cold-start popularity from raw ratings, labelled not private. Item existence: an "
    "upload of a tenant with auto_create_items creates the items it names, which other "
    "tenants can detect (their uploads naming them are accepted); differentially private "
    "jobs neither train on nor serve such items. Not covered: an active coordinator lying "
    "about dropouts. The tenant itself (its API key) holds its users' ratings and reads "
    "their statistics: it is trusted with them.")


def placement_key(placement: str, secure_aggregation: bool = False) -> str:
    """The row of :data:`THREAT_MODEL` for a job's placement."""
    if secure_aggregation:
        return "tenant+secure_aggregation"
    if placement not in THREAT_MODEL:
        raise ValueError(f"unknown placement {placement!r}; one of {', '.join(PLACEMENTS)}")
    return placement


def threat_model(placement: str, secure_aggregation: bool = False,
                 epsilon: float | str | None = None, private: bool = True
                 ) -> dict[str, Any]:
    """The JSON-ready threat model of one report: unit, and per adversary what it learns
    and the epsilon (the report's ``epsilon``, where the cell says the charged one). A job
    without a DP guarantee (``private`` False) states epsilon "infinity" for every
    adversary: nothing it published is covered."""
    key = placement_key(placement, secure_aggregation)
    rows = []
    for adversary in ADVERSARIES:
        learns, eps = THREAT_MODEL[key][adversary]
        rows.append({"adversary": adversary, "learns": learns,
                     "epsilon": "infinity" if not private else _figure(eps, epsilon)})
    return {"unit": UNIT, "unit_detail": UNIT_DETAIL, "placement": key, "adversaries": rows,
            "not_covered": NOT_COVERED}


def _figure(cell: str, epsilon: float | str | None) -> float | str:
    if cell != CHARGED or epsilon is None:
        return cell
    if isinstance(epsilon, float) and math.isinf(epsilon):
        return "infinity"
    return epsilon


def markdown_table() -> str:
    """The table docs/explanation/privacy.md shows: adversaries as rows, placements as
    columns, each cell what the adversary learns and at what epsilon."""
    head = "| adversary | " + " | ".join(f"`{p}`" for p in PLACEMENTS) + " |"
    lines = [head, "|---" * (len(PLACEMENTS) + 1) + "|"]
    for adversary in ADVERSARIES:
        cells = [f"{THREAT_MODEL[p][adversary][0]}; epsilon: "
                 f"{THREAT_MODEL[p][adversary][1]}" for p in PLACEMENTS]
        lines.append(f"| {adversary} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
