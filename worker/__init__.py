"""Celery app and tasks: thin adapters that load by id, call pure code and persist."""
