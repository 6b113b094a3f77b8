"""Differential privacy for fedrec uploads: clipping, mechanisms, accounting, budgets.

Pure code (numpy, scipy): no web, SQL or Celery imports. The
algorithms never import this package; :class:`DPPrivatizer` wraps their uploads.
"""

from privacy.accountant import Event, Spend, noise_for_epsilon, spend
from privacy.bernoulli import bernoulli_epsilon, bernoulli_xor
from privacy.clipping import clip_arrays, clip_l1, clip_l2, clip_value
from privacy.gaussian import analytic_sigma, classic_sigma, gaussian_noise
from privacy.laplace import laplace_epsilon, laplace_noise, laplace_rdp, rfrec_entry_epsilon
from privacy.ledger import (
    Budget,
    BudgetExceeded,
    Ledger,
    check_plan,
    plan_from_schedule,
    projected_spend,
    worst_case_plan,
)
from privacy.wrapper import DPPrivatizer, DPSpec, event_for, privacy_report, privatize

__all__ = [
    "Budget", "BudgetExceeded", "DPPrivatizer", "DPSpec", "Event", "Ledger", "Spend",
    "analytic_sigma", "bernoulli_epsilon", "bernoulli_xor", "check_plan", "classic_sigma",
    "clip_arrays", "clip_l1", "clip_l2", "clip_value", "event_for", "gaussian_noise",
    "laplace_epsilon", "laplace_noise", "laplace_rdp", "noise_for_epsilon", "plan_from_schedule",
    "privacy_report", "privatize", "projected_spend", "rfrec_entry_epsilon", "spend",
    "worst_case_plan",
]
