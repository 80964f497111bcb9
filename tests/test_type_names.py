"""Job type names follow one rule in workers.toml, `submit` and the Queue API: a type no
configuration could run is refused where it is given, with the same one-line message."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest

from fairsched.config import load_config
from fairsched.errors import ConfigError
from fairsched.store.queue import Queue
from fairsched.type_names import MAX_TYPE_NAME, type_name_problem
from tests.conftest import jobs_in

# Each was taken by `submit` with only FAIRSCHED_DATABASE_URL set; the long one then failed
# as "payload string too long" (pg_notify's limit), after the insert.
BAD = [" ", "a\nb", "\x1b[31mred", "x" * 10_000, "", ".pdf", "pdf\n", "pdf job", "é",
       "t" * (MAX_TYPE_NAME + 1)]
GOOD = ["pdf", "_x", "0", "app/render:pdf-v2.1", "t" * MAX_TYPE_NAME]


@pytest.mark.parametrize("name", GOOD)
def test_the_rule_takes_these(name):
    assert type_name_problem(name) is None


@pytest.mark.parametrize("name", BAD, ids=range(len(BAD)))
def test_the_message_is_one_short_line(name):
    problem = type_name_problem(name)
    assert problem.startswith("invalid job type ")
    assert problem.endswith("a type name is letters, digits and _.:/- (the first a letter, "
                            "digit or _), at most 64 characters")
    assert "\n" not in problem and "\x1b" not in problem and len(problem) < 200


@pytest.mark.parametrize("name", BAD, ids=range(len(BAD)))
def test_submit_refuses_a_bad_type_with_only_a_database_url(db, tmp_path, name):
    env = {k: v for k, v in os.environ.items() if k != "FAIRSCHED_CONFIG"}
    env["FAIRSCHED_DATABASE_URL"] = db
    for extra in ((), ("--on-demand",)):
        result = subprocess.run([sys.executable, "-m", "fairsched", "submit", name, *extra],
                                capture_output=True, text=True, env=env, cwd=tmp_path,
                                timeout=60)
        assert result.returncode == 2, (extra, result.stderr)
        assert result.stderr == f"fairsched: {type_name_problem(name)}\n", extra
        assert result.stdout == ""
    assert jobs_in(db) == 0


def test_submit_takes_a_good_type_with_only_a_database_url(db, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FAIRSCHED_CONFIG"}
    env["FAIRSCHED_DATABASE_URL"] = db
    result = subprocess.run([sys.executable, "-m", "fairsched", "submit", "app/render:pdf-v2.1"],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    assert jobs_in(db) == 1


@pytest.mark.parametrize("name", BAD, ids=range(len(BAD)))
def test_queue_enqueue_refuses_a_bad_type_and_writes_nothing(db, name):
    with psycopg.connect(db, autocommit=True) as conn:
        queue = Queue(conn)
        with pytest.raises(ValueError) as err:
            queue.enqueue(name)
        assert str(err.value) == type_name_problem(name)
        with pytest.raises(ValueError) as err:
            queue.enqueue_many([{"type": "pdf"}, {"type": name}])
        assert str(err.value) == f"job 1: {type_name_problem(name)}"
    assert jobs_in(db) == 0


def test_queue_enqueue_refuses_a_type_that_is_no_string(db):
    with psycopg.connect(db, autocommit=True) as conn, pytest.raises(ValueError) as err:
        Queue(conn).enqueue(7)
    assert str(err.value).startswith("invalid job type 7 (int, not a string): ")


@pytest.mark.parametrize("name", [n for n in BAD if n], ids=range(len(BAD) - 1))
def test_workers_toml_refuses_a_bad_type(tmp_path, name):
    import json

    config = tmp_path / "workers.toml"
    # JSON's string escapes are TOML's: the name goes into the file as it is.
    config.write_text(f'[[worker]]\nname = "pdf"\ntypes = [{json.dumps(name)}]\n'
                      'handler = "handlers:render_pdf"\n')
    with pytest.raises(ConfigError) as err:
        load_config(config)
    assert str(err.value) == (f"{config}: [[worker]] 'pdf' key 'types' has an "
                              f"{type_name_problem(name)}")
