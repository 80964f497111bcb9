"""The queue's messages spell a path with a line break in it ('a\\nb'), so each stays one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fairsched.store.errors import BadStateDir, DatabaseUnavailable
from fairsched.store.queue import Queue

WORKERS = '[[worker]]\nname = "pdf"\ntypes = ["pdf"]\nhandler = "m:f"\n'


def config_in(tmp_path: Path, supervisor: str) -> Path:
    """A workers.toml in a folder whose name has a line break, with `supervisor` settings."""
    folder = tmp_path / "my\nconfig"
    folder.mkdir()
    path = folder / "workers.toml"
    path.write_text(f"[supervisor]\n{supervisor}\n\n{WORKERS}")
    return path


def error_of(*args: str) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("FAIRSCHED_DATABASE_URL", "FAIRSCHED_CONFIG")}
    result = subprocess.run([sys.executable, "-m", "fairsched", *args], capture_output=True,
                            text=True, env=env, timeout=60)
    assert result.stdout == "", result.stdout
    return result.returncode, result.stderr


def test_a_database_setting_that_is_no_url_names_its_file_on_one_line(tmp_path):
    config = config_in(tmp_path, 'database = "not a url"')
    code, said = error_of("jobs", "--config", str(config))
    assert (code, said.splitlines()[0]) == (2, f"fairsched: {str(config)!r}: [supervisor] key "
                                               "'database' is not a PostgreSQL URL or connection "
                                               "string: missing \"=\" after \"not\" in connection "
                                               "info string"), said
    assert said.count("\n") == 1, said


def test_a_state_dir_the_embedded_database_cannot_take_is_one_line(tmp_path):
    config = config_in(tmp_path, 'state_dir = "st\\nate"')
    pgdata = config.parent / "st\nate" / "pg"
    assert error_of("jobs", "--config", str(config)) == (
        2, f"fairsched: {str(config)!r}: [supervisor] key 'state_dir': the embedded PostgreSQL "
           f"cannot take a path with a space, a quote or a backslash ({str(pgdata)!r}): choose "
           "one without, or use an external database (FAIRSCHED_DATABASE_URL)\n")


def test_a_file_that_cannot_be_opened_in_the_state_dir_is_named_on_one_line(tmp_path):
    config = config_in(tmp_path, 'state_dir = "st\\nate"')
    lock = config.parent / "st\nate" / "pg.lock"
    lock.mkdir(parents=True)  # a folder where the embedded database's lock file goes
    assert error_of("jobs", "--config", str(config)) == (
        1, f"fairsched: {str(lock)!r}: Is a directory\n")


def test_a_state_dir_last_used_with_an_external_database_is_one_line(tmp_path):
    config = config_in(tmp_path, 'state_dir = "st\\nate"')
    state = config.parent / "st\nate"
    state.mkdir()
    (state / "external-database").write_text("")
    for command in (["jobs"], ["submit", "pdf"]):
        assert error_of(*command, "--config", str(config)) == (
            2, f"fairsched: the supervisor on {str(state)!r} used an external database when it "
               "last ran; give this command its URL with FAIRSCHED_DATABASE_URL or `[supervisor] "
               f"database` in {str(config)!r} (or remove {str(state / 'external-database')!r} to "
               "start an embedded database there)\n")


def test_queue_open_names_a_folder_with_a_line_break_on_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("FAIRSCHED_DATABASE_URL", raising=False)
    nowhere = tmp_path / "no\ndatabase"
    with pytest.raises(DatabaseUnavailable) as raised:
        Queue.open(nowhere)
    assert str(raised.value) == (f"{str(nowhere)!r}: no embedded database here; give the "
                                 "supervisor's workers.toml (it names the database), or the "
                                 "state_dir of one that uses the embedded database")
    (tmp_path / "file").write_text("")
    blocked = tmp_path / "file" / "st\nate"
    with pytest.raises(BadStateDir) as raised:
        Queue.open(blocked, create=True)
    assert str(raised.value) == (f"[supervisor] key 'state_dir': cannot create "
                                 f"{str(blocked)!r}: Not a directory")
