"""The dashboard's privacy card states the report's threat model (privacy.threat_model)."""

from app.dashboard.data import plain_privacy
from privacy import threat_model as tm


def test_the_dashboard_states_the_threat_model_of_a_report():
    report = {"guarantee": "differentially private: epsilon 3.2", "private": True,
              "unit": "user", "placement": "central",
              "threat_model": tm.threat_model("central", epsilon=3.2)}
    text = " ".join(plain_privacy(report))
    assert "one user account of one tenant" in text
    assert "Against other tenants: learns V" in text and "(epsilon: 3.2)" in text
    assert "Against operator/coordinator: learns hosted tenants' raw ratings" in text
