"""Stored RFRec and RFRecF job configs get the step and penalty schedules' fields with the
values that keep their old behaviour.

RFRec and RFRecF gained ``lr_final`` (a half-cosine decay of the step size over the K
iterations) and ``lam_start`` (a geometric growth of psi's weight lambda over them), and
their defaults schedule one or both (BENCHMARKS.md, "RFRec and RFRecF: schedules chosen on
the validation carve-out"). A job stored before them (queued, running, or the parent a
scheduled retraining copies) would otherwise load the new schedule; it gets ``1.0`` for
both (a constant step and lambda, its earlier behaviour). A job that has the fields is
untouched. The same pattern as 0014.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-24
"""

from __future__ import annotations

from migrations.job_configs import add_fields, remove_fields

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

#: per algorithm: each field added since, with the value of the earlier behaviour
_CONSTANT = {"lr_final": 1.0, "lam_start": 1.0}
EARLIER = {"rfrec": _CONSTANT, "rfrecf": _CONSTANT}


def upgrade() -> None:
    add_fields(EARLIER)


def downgrade() -> None:
    remove_fields(EARLIER)
