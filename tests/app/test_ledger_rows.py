"""The service's ledger rows: written in one shape (:meth:`privacy.ledger.Charge.row`), and
rows stored in the older shapes (before that shape) still answer every reader the same:
budgets, the job's privacy report, the tenant's report and its ``/privacy`` route."""

from __future__ import annotations

import sqlalchemy as sa

from app.training.ledger import load_ledger
from app.training.models import LedgerEntry
from tests.training_helpers import make_tenants, submit_job, wait_job

DP = {"mechanism": "gaussian", "noise_multiplier": 2.0, "clip": 1.0}

#: a stored row rewritten into each shape the service wrote before the one shape
OLD_SHAPES = [
    lambda new: {"event": new["event"], "dp": new["dp"]},
    lambda new: {"event": new["event"], "dp": new["dp"], "by": "agent",
                 "refused": "x[0] has norm 9"},
    lambda new: {"event": new["event"], "dp": new["dp"], "by": "agent"},
    lambda new: {"event": new["event"], "dp": new["dp"], "by": "agent",
                 "secure_aggregation": True},
]


def _answers(app, client, job_id, tenants):
    out = {"job": client.get(f"/v1/admin/jobs/{job_id}/report").json()["privacy"]}
    for tid, key in tenants:
        auth = {"Authorization": f"Bearer {key}"}
        out[f"privacy {tid}"] = client.get(f"/v1/tenants/{tid}/privacy", headers=auth).json()
        out[f"report {tid}"] = client.get(f"/v1/tenants/{tid}/report",
                                          headers=auth).json()["privacy"]
    with app.state.sessions() as s:
        out["ledger"] = load_ledger(s, [t for t, _ in tenants]).to_dict()
    return out


def test_rows_are_written_in_one_shape_and_old_shapes_answer_the_same(env):
    app, client = env
    tenants = make_tenants(client, budget=100.0)
    job = wait_job(client, submit_job(client, rounds=2, dp=DP).json()["id"])
    assert job["status"] == "completed", job
    with app.state.sessions() as s:
        rows = s.execute(sa.select(LedgerEntry.id, LedgerEntry.event)
                         .order_by(LedgerEntry.id)).all()
    assert len(rows) == 4  # 2 tenants x 2 rounds
    for _, row in rows:
        assert set(row) == {"event", "dp", "by", "note"}, row
        assert (row["by"], row["note"], row["dp"]["mechanism"]) == ("coordinator", None,
                                                                    "gaussian")
    before = _answers(app, client, job["id"], tenants)
    assert before["job"]["private"] is True and before["job"]["epsilon_max"] > 0

    with app.state.sessions() as s:
        for n, (entry_id, row) in enumerate(rows):
            s.execute(sa.update(LedgerEntry).where(LedgerEntry.id == entry_id)
                      .values(event=OLD_SHAPES[n % len(OLD_SHAPES)](row)))
        s.commit()
        stored = [e for (e,) in s.execute(sa.select(LedgerEntry.event)
                                          .order_by(LedgerEntry.id)).all()]
    assert [set(e) for e in stored] == [{"event", "dp"}, {"event", "dp", "by", "refused"},
                                        {"event", "dp", "by"},
                                        {"event", "dp", "by", "secure_aggregation"}]
    assert _answers(app, client, job["id"], tenants) == before
