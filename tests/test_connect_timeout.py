"""How long a connection waits for a server that never takes it: the URL's connect_timeout
and PGCONNECT_TIMEOUT win over fairsched's default."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

from fairsched.store.connections import open_connection


@contextlib.contextmanager
def silent_server():
    """The folder of a PostgreSQL socket that queues connections and never answers them."""
    folder = Path(tempfile.mkdtemp(prefix="fs-", dir="/tmp"))
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(folder / ".s.PGSQL.5432"))
        listener.listen(8)
        yield folder
    finally:
        listener.close()
        shutil.rmtree(folder)


def jobs_command(url: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("FAIRSCHED_CONFIG", "PGCONNECT_TIMEOUT",
                            "FAIRSCHED_DATABASE_TIMEOUT")}
    environ.update(env, FAIRSCHED_DATABASE_URL=url)
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "fairsched", "jobs"], capture_output=True,
                            text=True, env=environ, timeout=60, cwd="/")
    return result, time.monotonic() - started


@pytest.mark.parametrize("form", ["url", "keywords"])
def test_the_urls_connect_timeout_wins_over_the_default(form):
    with silent_server() as folder:
        url = (f"postgresql://x@/db?host={folder}&connect_timeout=1" if form == "url"
               else f"host={folder} dbname=db user=x connect_timeout=1")
        result, took = jobs_command(url)
    assert (result.returncode, result.stdout) == (1, ""), result.stderr
    line = result.stderr.strip()
    assert "connection timeout expired (after 2 s; the URL's connect_timeout sets how long" \
           " to wait)" in line, line
    assert took < 8, took  # not the 10 s default


def test_pgconnect_timeout_wins_over_the_default_and_fairsched_database_timeout_over_it():
    with silent_server() as folder:
        url = f"host={folder} dbname=db user=x"
        result, took = jobs_command(url, PGCONNECT_TIMEOUT="2")
        assert result.returncode == 1, result.stderr
        assert "(after 2 s; PGCONNECT_TIMEOUT sets how long to wait)" in result.stderr
        assert took < 8, took
        result, _ = jobs_command(url, PGCONNECT_TIMEOUT="1", FAIRSCHED_DATABASE_TIMEOUT="3")
        assert "(after 3 s; FAIRSCHED_DATABASE_TIMEOUT sets how long to wait)" in result.stderr


def test_a_supervisors_connection_takes_the_urls_connect_timeout():
    with silent_server() as folder:
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError, match="timeout expired"):
            asyncio.run(open_connection(f"host={folder} dbname=db user=x connect_timeout=2",
                                        lease=15.0))
        took = time.monotonic() - started
    assert took < 8, took
