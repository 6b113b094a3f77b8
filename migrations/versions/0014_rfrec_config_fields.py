"""Stored RFRec and RFRecF job configs get the fields added since they were written, with
the values that keep their old behaviour.

RFRec and RFRecF gained ``bias`` (user and item bias terms and the tenant's mean, now on by
default, and changing the shape of a tenant's U_i and of V_bar) and the weighted-lambda
ridge weights ``lam_u_rating`` and ``lam_v_rating`` (now non-zero by default). A job stored
before them (queued, running, or the parent a scheduled retraining copies) would otherwise
load the new defaults: a resumed job would not fit its own stored factors. The fields get
the values of the earlier behaviour (no bias terms, no weighted ridge); a job that has them
already is untouched. The same pattern as 0012.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-24
"""

from __future__ import annotations

from migrations.job_configs import add_fields, remove_fields

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

#: per algorithm: each field added since, with the value of the earlier behaviour
_RFREC = {"bias": False, "lam_u_rating": 0.0, "lam_v_rating": 0.0}
EARLIER = {"rfrec": _RFREC, "rfrecf": _RFREC}


def upgrade() -> None:
    add_fields(EARLIER)


def downgrade() -> None:
    remove_fields(EARLIER)
