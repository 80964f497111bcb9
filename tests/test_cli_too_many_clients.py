"""A command refused by a PostgreSQL that has reached its max_connections says what to do."""

from __future__ import annotations

import contextlib

import psycopg

from tests.test_connect_timeout import jobs_command


def test_a_command_refused_for_too_many_clients_says_to_close_some_or_raise_the_limit(db):
    with contextlib.ExitStack() as held:
        while True:  # every connection the server takes, until it refuses one
            try:
                held.enter_context(psycopg.connect(db, autocommit=True))
            except psycopg.OperationalError as exc:
                assert "too many clients already" in str(exc), exc
                break
        result, _ = jobs_command(db)
    assert (result.returncode, result.stdout) == (1, ""), result.stderr
    line = result.stderr.strip()
    assert "\n" not in line, line
    assert line.endswith("FATAL:  sorry, too many clients already (the server's max_connections "
                         "is reached: close idle connections or raise it)"), line
