"""open_database: URL precedence, and the embedded server's life shared between processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import psycopg
import pytest

from fairsched.store.database import ENV_URL, open_database, redact
from fairsched.store.errors import DatabaseUnavailable

# Stands in for a supervisor: opens the embedded database, holds it until told to close.
HOLDER_SCRIPT = """
import sys
from pathlib import Path
from fairsched.store.database import open_database
db = open_database(Path(sys.argv[1]), None)
print(db.url, flush=True)
sys.stdin.readline()
db.close()
print("closed", flush=True)
"""


def postmaster_pid(state_dir: Path) -> int | None:
    try:
        pid = int((state_dir / "pg" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return None if exited(pid) else pid


def exited(pid: int) -> bool:
    # The postmaster is nobody's child here; a zombie of it has exited all the same.
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + 20
    while not exited(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=5) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)
    except psycopg.OperationalError:
        return False


@pytest.fixture
def state_dir(monkeypatch, reused_state_dir):
    """An embedded state directory with no database URL in the environment."""
    monkeypatch.delenv(ENV_URL, raising=False)
    return reused_state_dir


@pytest.fixture
def holders():
    """Start holder processes; kill any still running at the end."""
    started: list[subprocess.Popen] = []

    def start(state_dir: Path) -> tuple[subprocess.Popen, str]:
        env = {k: v for k, v in os.environ.items() if k != ENV_URL}
        proc = subprocess.Popen([sys.executable, "-c", HOLDER_SCRIPT, str(state_dir)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        started.append(proc)
        url = proc.stdout.readline().strip()
        assert url.startswith("postgresql://"), f"holder did not open the database: {url!r}"
        return proc, url

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            stream.close()


def finish(proc: subprocess.Popen) -> None:
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "closed"
    assert proc.wait(20) == 0


def test_embedded_server_starts_in_a_new_state_dir_and_stops_on_close(monkeypatch, short_tmp):
    monkeypatch.delenv(ENV_URL, raising=False)
    nested = short_tmp / "state" / "deeper"
    db = open_database(nested, None)
    try:
        assert db.kind == "embedded"
        assert nested.is_dir()
        with db.connect() as conn:
            assert conn.execute("SELECT count(*) FROM fairsched_jobs").fetchone() == (0,)
        pid = postmaster_pid(nested)
        assert pid is not None
    finally:
        db.close()
    assert wait_gone(pid)
    db.close()  # a second close is harmless


def test_a_command_beside_a_supervisor_leaves_its_server_running(state_dir, holders):
    supervisor, url = holders(state_dir)
    pid = postmaster_pid(state_dir)
    command = open_database(state_dir, None)
    assert command.url.split("?")[0] == url.split("?")[0]
    assert postmaster_pid(state_dir) == pid  # attached, not a second server
    command.close()
    assert postmaster_pid(state_dir) == pid
    assert answers(url)
    finish(supervisor)  # it started the server and was its last user
    assert wait_gone(pid)


def test_the_last_user_stops_the_server_whoever_started_it(state_dir, holders):
    first = open_database(state_dir, None)
    pid = postmaster_pid(state_dir)
    try:
        supervisor, url = holders(state_dir)
    finally:
        first.close()
    assert postmaster_pid(state_dir) == pid and answers(url)
    finish(supervisor)
    assert wait_gone(pid)


def test_a_user_that_died_without_closing_does_not_keep_the_server(state_dir, holders):
    crashed, _ = holders(state_dir)
    pid = postmaster_pid(state_dir)
    crashed.kill()
    crashed.wait()
    db = open_database(state_dir, None)
    db.close()
    assert wait_gone(pid)


def test_ensure_running_brings_a_crashed_server_back(state_dir):
    db = open_database(state_dir, None)
    try:
        pid = postmaster_pid(state_dir)
        os.kill(pid, signal.SIGQUIT)  # immediate shutdown, as after a crash
        assert wait_gone(pid)
        assert not answers(db.url)
        db.ensure_running()
        new_pid = postmaster_pid(state_dir)
        assert new_pid not in (None, pid)
        with db.connect() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        db.ensure_running()  # running already: nothing to do
        assert postmaster_pid(state_dir) == new_pid
    finally:
        db.close()
    assert wait_gone(new_pid)


def test_environment_url_wins_over_the_setting(database_url, monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_URL, database_url)
    db = open_database(tmp_path / "unused", "postgresql://nobody@/nowhere?host=/nonexistent")
    try:
        assert (db.url, db.kind) == (database_url, "external")
        assert not (tmp_path / "unused").exists()
    finally:
        db.close()


def test_the_setting_is_used_without_environment_url(database_url, monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_URL, raising=False)
    with open_database(tmp_path, database_url) as db:
        assert db.kind == "external"
        with db.connect() as conn:
            assert conn.execute("SELECT max(version) FROM fairsched_schema_version").fetchone()[0]


def test_an_unreachable_server_is_one_line_without_password(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_URL, raising=False)
    url = "postgresql://app:secret@/jobs?host=/nonexistent-fairsched-dir"
    with pytest.raises(DatabaseUnavailable) as err:
        open_database(tmp_path, url)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("cannot connect to PostgreSQL at postgresql://app:***@/jobs")
    assert "secret" not in message


def test_redact_hides_only_the_password():
    assert redact("postgresql://u:pw@db.example:5432/x") == "postgresql://u:***@db.example:5432/x"
    assert redact("postgresql://u@db/x") == "postgresql://u@db/x"
    assert redact("postgresql:///x?host=/tmp/pg") == "postgresql:///x?host=/tmp/pg"
    assert (redact("postgresql://u@db/x?password=s3cret&sslmode=require")
            == "postgresql://u@db/x?password=***&sslmode=require")
    assert redact("host=db user=u password=s3cret") == "host=db user=u password=***"
    assert redact("host=db password = 'se \\' cret' user=u") == "host=db password = *** user=u"


def test_sigterm_while_the_embedded_server_starts_stops_it_too(monkeypatch, short_tmp):
    """SIGTERM before the database is up (initdb takes most of a second) is honoured once it
    is: exit 0, the workers stopped, and the embedded server stopped rather than left behind."""
    monkeypatch.delenv(ENV_URL, raising=False)
    (short_tmp / "noop_handlers.py").write_text("def noop(job):\n    return None\n")
    config = short_tmp / "workers.toml"
    config.write_text('[supervisor]\nstate_dir = "state"\n\n[[worker]]\nname = "noop"\n'
                      'types = ["noop"]\nhandler = "noop_handlers:noop"\n')
    proc = subprocess.Popen([sys.executable, "-m", "fairsched", "supervise", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "starting the embedded PostgreSQL in" in line:
                break
        proc.send_signal(signal.SIGTERM)
        seen += proc.stdout.readlines()
        assert proc.wait(60) == 0, "".join(seen)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    output = "".join(seen)
    assert "stopping as soon as the database is connected" in output
    assert "supervisor stopped" in output and "Traceback" not in output
    pgdata = str(short_tmp / "state" / "pg")
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if pgdata in " ".join(p.info["cmdline"] or [])]
    assert left == []


def embedded_config(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "noop_handlers.py").write_text("def noop(job):\n    return None\n")
    config = folder / "workers.toml"
    config.write_text('[supervisor]\nstate_dir = "state"\n\n[[worker]]\nname = "noop"\n'
                      'types = ["noop"]\nhandler = "noop_handlers:noop"\n')
    return config


def test_an_embedded_server_that_cannot_start_fails_supervise_in_one_line(monkeypatch, short_tmp):
    # pg_ctl runs in a thread of the supervisor, whose SIGCHLD handler must leave its exit
    # status to it: taken, it read as success and the start waited for ever.
    monkeypatch.delenv(ENV_URL, raising=False)
    config = embedded_config(short_tmp)
    cli = [sys.executable, "-m", "fairsched"]
    made = subprocess.run([*cli, "jobs", "--config", str(config)], capture_output=True, text=True,
                          timeout=60)
    assert made.returncode == 0, made.stderr
    with open(short_tmp / "state" / "pg" / "postgresql.conf", "a") as conf:
        conf.write("bogus_setting = 1\n")
    for command in ("jobs", "supervise"):
        result = subprocess.run([*cli, command, "--config", str(config)], capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 1, (command, result.stderr)
        errors = [ln for ln in result.stderr.splitlines() if "INFO" not in ln]
        assert len(errors) == 1, (command, result.stderr)
        assert 'unrecognized configuration parameter "bogus_setting"' in errors[0], errors
        assert "contains errors (see " in errors[0], errors


def test_an_embedded_server_under_a_path_with_a_space_is_refused_in_one_line(monkeypatch,
                                                                             short_tmp):
    # A setting to change, not a failure to try again: exit 2 (a systemd unit stops there).
    monkeypatch.delenv(ENV_URL, raising=False)
    config = embedded_config(short_tmp / "my docs")
    for command in ("jobs", "supervise"):
        result = subprocess.run([sys.executable, "-m", "fairsched", command, "--config",
                                 str(config)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, result.stderr
        errors = [ln for ln in result.stderr.splitlines() if "INFO" not in ln]
        assert len(errors) == 1, result.stderr
        assert "cannot take a path with a space" in errors[0]
        assert f"{config}: [supervisor] key 'state_dir'" in errors[0], errors


@pytest.mark.parametrize("command", ["supervise", "jobs"])
def test_a_state_dir_that_cannot_be_made_is_a_config_error(monkeypatch, short_tmp, command):
    monkeypatch.delenv(ENV_URL, raising=False)
    config = embedded_config(short_tmp)
    (short_tmp / "afile").write_text("")
    for state_dir, why in [("afile", "a file is in the way"),
                           ("/proc/fs-none", "No such file or directory")]:
        config.write_text(config.read_text().replace('state_dir = "state"',
                                                     f'state_dir = "{state_dir}"'))
        result = subprocess.run([sys.executable, "-m", "fairsched", command, "--config",
                                 str(config)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        assert "[supervisor] key 'state_dir'" in result.stderr and why in result.stderr, (
            result.stderr)
        config.write_text(config.read_text().replace(f'state_dir = "{state_dir}"',
                                                     'state_dir = "state"'))


def test_the_reason_a_start_failed_is_read_from_that_start_only(tmp_path):
    from fairsched.store.database import _why_not_started

    log = tmp_path / "log"
    log.write_text(
        "2026-11-24 12:00:00.000 UTC [10] LOG:  starting PostgreSQL 18.6 on x86_64\n"
        "2026-11-24 12:00:01.000 UTC [11] FATAL:  the database system is shutting down\n"
        "2026-11-24 12:05:00.000 UTC [20] LOG:  starting PostgreSQL 18.6 on x86_64\n"
        "2026-11-24 12:05:00.100 UTC [21] LOG:  database system was interrupted; last known up\n")
    assert _why_not_started(log) == ("2026-11-24 12:05:00.100 UTC [21] LOG:  database system "
                                     "was interrupted; last known up")
    with open(log, "a") as f:
        f.write("2026-11-24 12:05:01.000 UTC [20] LOG:  unrecognized parameter \"x\"\n"
                "2026-11-24 12:05:01.000 UTC [20] FATAL:  configuration file contains errors\n")
    assert _why_not_started(log) == ('unrecognized parameter "x"; configuration file contains '
                                     "errors")
    assert _why_not_started(tmp_path / "none") is None


def test_a_supervisor_on_the_embedded_database_names_its_url_for_others(monkeypatch, short_tmp):
    monkeypatch.delenv(ENV_URL, raising=False)
    config = embedded_config(short_tmp / "a")
    proc = subprocess.Popen([sys.executable, "-m", "fairsched", "supervise", "--config",
                             str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "embedded PostgreSQL at " in line:
                break
        said = re.search(r"FAIRSCHED_DATABASE_URL='([^']+)'", seen[-1])
        assert said, "".join(seen)
        # A queue command elsewhere, with no workers.toml, reaches the same database.
        env = dict(os.environ, FAIRSCHED_DATABASE_URL=said[1])
        submitted = subprocess.run([sys.executable, "-m", "fairsched", "submit", "noop"],
                                   cwd=short_tmp, env=env, capture_output=True, text=True,
                                   timeout=60)
        assert submitted.returncode == 0, submitted.stderr
        for line in proc.stdout:
            seen.append(line)
            if " succeeded: " in line:
                break
        assert f"job {int(submitted.stdout)} succeeded" in seen[-1], "".join(seen)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        proc.stdout.close()


def test_an_embedded_server_left_without_its_database_gets_it_back(monkeypatch, short_tmp):
    # A first start cut short (Ctrl-C while initdb ran) can leave the cluster without the
    # database fairsched uses: every later command failed with 'database "postgres" does
    # not exist' until the folder was removed by hand.
    monkeypatch.delenv(ENV_URL, raising=False)
    config = embedded_config(short_tmp)
    db = open_database(short_tmp / "state", None)
    try:
        template1 = db.url.replace("/postgres?", "/template1?")
        with psycopg.connect(template1, autocommit=True) as conn:
            conn.execute("DROP DATABASE postgres")
    finally:
        db.close()
    cli = [sys.executable, "-m", "fairsched"]
    listed = subprocess.run([*cli, "jobs", "--config", str(config)], capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert "had no 'postgres' database (its first start was cut short): created it" in (
        listed.stderr)
    submitted = subprocess.run([*cli, "submit", "noop", "--config", str(config)],
                               capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0 and submitted.stdout.strip() == "1", submitted.stderr
