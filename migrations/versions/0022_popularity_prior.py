"""Stored ials and dp-ials job configs keep their earlier scores: no popularity prior.

These ranking models now add a popularity prior to the served score (``popularity_prior``:
beta times the standardised log count of the released item counts; dp-ials releases those
counts with a ``prior_share`` of each release, issue 30: on sparse, skewed data the iALS
scores alone lost to a most-popular list). A job stored before (queued, running, or the
parent a scheduled retraining copies) keeps beta 0: its earlier lists, and the privacy plan
it was accepted with (no count array in its releases). A job that has the field already is
untouched.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-28
"""

from __future__ import annotations

from migrations.job_configs import add_fields, remove_fields

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

#: per algorithm: the field added since, with the value of the earlier behaviour
EARLIER = {name: {"popularity_prior": 0.0} for name in ("ials", "dp-ials")}


def upgrade() -> None:
    add_fields(EARLIER)


def downgrade() -> None:
    remove_fields(EARLIER)
