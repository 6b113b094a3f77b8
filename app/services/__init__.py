"""Use cases of the service, as plain functions: what the HTTP routes (:mod:`app.routes`),
the dashboard (:mod:`app.dashboard`) and the command line share.

Each takes a database session (and the settings, or the application whose state holds the
Celery app, where it needs them) and returns domain objects or raises
:class:`app.problems.ApiError`, a refusal with a status and a stable code that the HTTP
layer answers as a problem document and the dashboard shows on its page. No handler calls
another handler: both call these (the split of the FastAPI full-stack template's
``crud.py`` and ``api/routes/``).
"""
