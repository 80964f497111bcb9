"""Versioned migrations: idempotent, safe when two processes migrate at once, and the table's rules."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from fairsched.errors import ConfigError
from fairsched.store.errors import SchemaError
from fairsched.store.schema import LATEST_VERSION, MIGRATION_LOCK, migrate
from tests.supervisor_harness import Supervisor

MIGRATE_SCRIPT = """
import sys
import psycopg
from fairsched.store.schema import migrate
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    print(migrate(conn))
"""


@pytest.fixture
def fresh_url(database_url):
    """An empty database on the test server, dropped afterwards."""
    name = f"fs_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield make_conninfo(database_url, dbname=name)
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def versions(url: str) -> list[int]:
    with psycopg.connect(url) as conn:
        return [v for (v,) in conn.execute(
            "SELECT version FROM fairsched_schema_version ORDER BY version")]


def test_migrate_is_idempotent(fresh_url):
    with psycopg.connect(fresh_url, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('fairsched_schema_version')").fetchone() == (None,)
        assert migrate(conn) == LATEST_VERSION
        assert migrate(conn) == LATEST_VERSION
    assert versions(fresh_url) == list(range(1, LATEST_VERSION + 1))


def test_two_processes_migrating_at_once_apply_each_step_once(fresh_url):
    # Hold the migration lock so both processes are queued on it, then let them race.
    with psycopg.connect(fresh_url) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        procs = [subprocess.Popen([sys.executable, "-c", MIGRATE_SCRIPT, fresh_url],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        try:
            deadline = time.monotonic() + 30
            while True:
                (waiting,) = holder.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                ).fetchone()
                if waiting == 2:
                    break
                assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
                assert time.monotonic() < deadline, "the migrating processes never reached the lock"
                time.sleep(0.02)
            holder.commit()
            outputs = [p.communicate(timeout=30) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert [out.strip() for out, _ in outputs] == [str(LATEST_VERSION)] * 2
    assert versions(fresh_url) == list(range(1, LATEST_VERSION + 1))


def test_a_supervisor_that_upgrades_the_schema_says_so(fresh_url):
    with psycopg.connect(fresh_url, autocommit=True) as conn:
        migrate(conn)  # then back to version 1, as a database of an older fairsched is
        conn.execute("ALTER TABLE fairsched_jobs DROP COLUMN claims")
        conn.execute("DROP TABLE fairsched_schedules")
        conn.execute("ALTER TABLE fairsched_jobs DROP COLUMN tenant")
        conn.execute("DROP TABLE fairsched_tenant_usage")
        conn.execute("DROP TABLE fairsched_limit_holds")
        conn.execute("DELETE FROM fairsched_schema_version WHERE version > 1")
    sup = Supervisor(fresh_url, "[[worker]]\nname = \"pdf\"\ntypes = [\"pdf\"]\n"
                                "handler = \"sup_handlers:echo\"\n")
    try:
        sup.start()
        assert sup.cli("submit", "pdf", "--on-demand").returncode == 0
        upgraded = sup.output().count(
            f"database schema upgraded from version 1 to {LATEST_VERSION}: a claim counter to "
            "fence outcomes on")
        assert upgraded == 1, sup.output()
        # Opened again: nothing left to do, nothing said.
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit() == 0
        sup.start()
        assert sup.output().count("database schema upgraded") == 1, sup.output()
    finally:
        sup.close()
    assert versions(fresh_url) == list(range(1, LATEST_VERSION + 1))


def test_a_newer_schema_is_refused_in_one_line(fresh_url):
    with psycopg.connect(fresh_url, autocommit=True) as conn:
        migrate(conn)
        conn.execute("INSERT INTO fairsched_schema_version (version, description)"
                     " VALUES (%s, 'from the future')", (LATEST_VERSION + 1,))
        with pytest.raises(SchemaError) as err:
            migrate(conn)
    message = str(err.value)
    assert "\n" not in message
    assert f"version {LATEST_VERSION + 1} is newer" in message
    assert isinstance(err.value, ConfigError)  # the command line exits 2: restarting cannot help


def test_the_job_table_enforces_priority_status_and_unfinished_keys(db):
    with psycopg.connect(db, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("INSERT INTO fairsched_jobs (type, priority) VALUES ('t', 11)")
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("INSERT INTO fairsched_jobs (type, status) VALUES ('t', 'lost')")
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("INSERT INTO fairsched_jobs (type, max_attempts) VALUES ('t', 0)")
        conn.execute("INSERT INTO fairsched_jobs (type, idempotency_key) VALUES ('t', 'k')")
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO fairsched_jobs (type, idempotency_key) VALUES ('t', 'k')")
        # Once the job is finished its key is free again.
        conn.execute("UPDATE fairsched_jobs SET status = 'succeeded' WHERE idempotency_key = 'k'")
        conn.execute("INSERT INTO fairsched_jobs (type, idempotency_key) VALUES ('t', 'k')")


def test_inserting_jobs_notifies_each_type_once_per_statement(db):
    with psycopg.connect(db, autocommit=True) as listener, \
            psycopg.connect(db, autocommit=True) as writer:
        listener.execute("LISTEN fairsched_jobs")
        # Plain SQL from an application wakes the supervisors too.
        writer.execute("INSERT INTO fairsched_jobs (type) VALUES ('a'), ('b'), ('a')")
        got = sorted((n.channel, n.payload) for n in listener.notifies(timeout=5, stop_after=2))
        more = list(listener.notifies(timeout=0.2))
    assert got == [("fairsched_jobs", "a"), ("fairsched_jobs", "b")]
    assert more == []
