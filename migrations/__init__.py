"""Alembic migrations: the only way fedrec's schema is created (see app.db.migrate)."""
