"""Federated training jobs: persistence, the round pipeline, reports and serving factors.

Pure maths lives in :mod:`algorithms` and :mod:`privacy`; this package only loads what a
step needs, calls it and persists the result (the Celery tasks in :mod:`worker.tasks` are
one-line wrappers around :mod:`app.training.pipeline`).
"""
