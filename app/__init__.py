"""fedrec's HTTP service (FastAPI + SQLAlchemy) and command-line interface."""
