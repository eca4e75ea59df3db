"""The catalog's migration history (Alembic revisions), one for SQLite and Postgres alike."""
