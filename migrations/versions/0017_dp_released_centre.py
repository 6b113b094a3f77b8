"""Stored DPALS, DP-FedMAvg and DP-FedMC-ADMM job configs keep their earlier centre and
user-bias rules.

These algorithms now centre their predictions on a released data centre
(``release_centre``: the mean of the users' mean ratings, from a ``centre_share`` of each
release), give the user bias its own ridge (``lam_bias``) and give users with fewer than
``factor_min_ratings`` ratings their bias alone (issue 17: their defaults were worse than
the global mean on sparse, skewed data). A job stored before (queued, running, or the
parent a scheduled retraining copies) keeps the public centre, the bias under ``lam_u``
and a factor for every user: its earlier behaviour, and the privacy plan it was accepted
with (no centre arrays). A job that has the fields already is untouched.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-24
"""

from __future__ import annotations

from migrations.job_configs import add_fields, remove_fields

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

#: per algorithm: each field added since, with the value of the earlier behaviour
EARLIER = {name: {"release_centre": False, "centre_share": 0.02, "lam_bias": None,
                  "factor_min_ratings": 1}
           for name in ("dpals", "dp-fedmavg", "dp-fedmc-admm")}


def upgrade() -> None:
    add_fields(EARLIER)


def downgrade() -> None:
    remove_fields(EARLIER)
