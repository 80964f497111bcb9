"""A command refused by a PostgreSQL that has reached its max_connections says what to do."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import psycopg

from tests.test_connect_timeout import jobs_command

REMEDY = "(the server's max_connections is reached: close idle connections or raise it)"


@contextlib.contextmanager
def every_slot_taken(url: str):
    """Hold every connection the server takes, until it refuses one."""
    with contextlib.ExitStack() as held:
        while True:
            try:
                held.enter_context(psycopg.connect(url, autocommit=True))
            except psycopg.OperationalError as exc:
                assert "too many clients already" in str(exc), exc
                break
        yield


def test_a_command_refused_for_too_many_clients_says_to_close_some_or_raise_the_limit(db):
    with every_slot_taken(db):
        result, _ = jobs_command(db)
    assert (result.returncode, result.stdout) == (1, ""), result.stderr
    line = result.stderr.strip()
    assert "\n" not in line, line
    assert line.endswith(f"FATAL:  sorry, too many clients already {REMEDY}"), line


def test_a_supervisor_refused_for_too_many_clients_says_to_close_some_or_raise_the_limit(
        db, short_tmp):
    config = short_tmp / "workers.toml"
    config.write_text('[supervisor]\nstate_dir = "state"\n\n[[worker]]\nname = "w"\n'
                      'types = ["t"]\ncommand = ["sleep", "60"]\n')
    env = dict(os.environ, FAIRSCHED_DATABASE_URL=db)
    with every_slot_taken(db):
        result = subprocess.run([sys.executable, "-m", "fairsched", "supervise", "--config",
                                 str(config)], capture_output=True, text=True, env=env,
                                timeout=60)
    assert result.returncode == 1, result.stderr
    line = result.stderr.strip()
    assert "\n" not in line, line  # no worker started, nothing else said
    assert line.startswith("fairsched: cannot connect to PostgreSQL at "), line
    assert line.endswith(f"FATAL:  sorry, too many clients already {REMEDY}"), line
