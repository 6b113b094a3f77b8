"""Stored job configs get the fields added since they were written, with the values that
keep their old behaviour.

FedMC-ADMM gained ``lam_rating`` and ``gamma_rating`` (per-rating ridge weights, now 0.085
by default) and FedMAvg ``bias``, ``aggregate`` and ``curvature`` (now on by default, and
``bias`` changes the shape of a tenant's factors). A job stored before them (queued,
running, or the parent a scheduled retraining copies) would otherwise load the new
defaults: a resumed FedMAvg job would not fit its own stored factors, and a FedMC-ADMM job
would change its regularisation mid-run. The fields get the values of the earlier
behaviour; a job that has them already is untouched.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24
"""

from __future__ import annotations

from migrations.job_configs import add_fields, remove_fields

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

#: per algorithm: each field added since, with the value of the earlier behaviour
EARLIER = {
    "fedmc-admm": {"lam_rating": 0.0, "gamma_rating": 0.0},
    "fedmavg": {"bias": False, "aggregate": "mean", "curvature": "global"},
}


def upgrade() -> None:
    add_fields(EARLIER)


def downgrade() -> None:
    remove_fields(EARLIER)
