"""`fairsched submit / jobs / retry / cancel`, run as real processes against real PostgreSQL."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

import psutil
import psycopg
import pytest

from fairsched.store.errors import OtherDatabase
from fairsched.store.queue import Queue
from tests.conftest import jobs_in
from tests.supervisor_harness import alive, wait_until

WORKERS_TOML = """
[supervisor]
state_dir = "state"

[[worker]]
name = "docs"
types = ["pdf", "ocr"]
handler = "myapp.jobs:render"
max_attempts = 4
"""

# Stands in for a running supervisor: keeps the embedded database open until told to stop.
HOLDER_SCRIPT = """
import sys
import tempfile
from fairsched.config import load_config
from fairsched.store.database import open_database
settings = load_config(sys.argv[1]).supervisor
db = open_database(settings.state_dir, settings.database)
print(db.url, flush=True)
sys.stdin.readline()
db.close()
"""


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "workers.toml"
    path.write_text(WORKERS_TOML)
    return path


def fairsched(*args: str, url: str | None, cwd: Path | None = None,
              timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("FAIRSCHED_DATABASE_URL", "FAIRSCHED_CONFIG")}
    if url is not None:
        env["FAIRSCHED_DATABASE_URL"] = url
    return subprocess.run([sys.executable, "-m", "fairsched", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=timeout)


@contextlib.contextmanager
def queue(url: str):
    with psycopg.connect(url, autocommit=True) as conn:
        yield Queue(conn)


def one_line_error(result: subprocess.CompletedProcess, code: int) -> str:
    assert result.returncode == code, (result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_a_host_that_only_names_the_database_queues_for_workers_elsewhere(db, tmp_path):
    # No workers.toml here, FAIRSCHED_DATABASE_URL set: any type goes (the workers that run
    # it live elsewhere), and the queue can be read and managed.
    submitted = fairsched("submit", "render", "--payload", '{"doc": 1}', url=db, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job_id = int(submitted.stdout)
    listed = fairsched("jobs", "--json", url=db, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [(j["id"], j["type"]) for j in json.loads(listed.stdout)] == [(job_id, "render")]
    assert fairsched("cancel", str(job_id), url=db, cwd=tmp_path).returncode == 0
    assert fairsched("retry", str(job_id), url=db, cwd=tmp_path).returncode == 0
    assert not (tmp_path / ".fairsched").exists()  # nothing written here
    # Without the database's URL, a workers.toml is still needed: where else is the queue?
    error = one_line_error(fairsched("jobs", url=None, cwd=tmp_path), 2)
    assert "workers.toml: no such file (pass --config or set FAIRSCHED_CONFIG)" in error


def test_submit_prints_the_id_and_stores_the_job(db, config):
    result = fairsched("submit", "pdf", "--payload", '{"doc": 3}', "--priority", "7",
                       "--max-attempts", "2", "--delay", "30", "--config", str(config), url=db)
    assert result.returncode == 0, result.stderr
    job_id = int(result.stdout)
    with queue(db) as q:
        job = q.get_job(job_id)
    assert (job["type"], job["payload"], job["priority"], job["max_attempts"]) == (
        "pdf", {"doc": 3}, 7, 2)
    assert (job["run_after"] - job["created_at"]).total_seconds() == 30


@pytest.mark.parametrize(("priority", "delay"), [("-0", "-0"), ("-00", "-0.0"), ("-0", "-.0"),
                                                 ("-0", "-0e3")])
def test_minus_zero_is_zero(db, config, priority, delay):
    result = fairsched("submit", "pdf", "--priority", priority, "--delay", delay,
                       "--config", str(config), url=db)
    assert result.returncode == 0, result.stderr
    with queue(db) as q:
        job = q.get_job(int(result.stdout))
    assert job["priority"] == 0 and job["run_after"] == job["created_at"], job
    listed = fairsched("jobs", "--json", "--limit", "1", "--config", str(config), url=db)
    assert [j["id"] for j in json.loads(listed.stdout)] == [job["id"]]


def test_submit_with_a_key_twice_gives_one_job(db, config):
    ids = {fairsched("submit", "ocr", "--key", "scan-9", "--config", str(config), url=db).stdout
           for _ in range(2)}
    assert len(ids) == 1 and jobs_in(db) == 1


def test_a_key_held_by_another_job_is_an_error(db, config):
    first = fairsched("submit", "pdf", "--key", "k", "--payload", '{"doc": 1}',
                      "--config", str(config), url=db)
    job_id = int(first.stdout)
    line = one_line_error(fairsched("submit", "ocr", "--key", "k", "--payload", '{"doc": 1}',
                                    "--config", str(config), url=db), 1)
    assert line == (f"fairsched: key 'k' is held by job {job_id} (type pdf, priority "
                    '0, payload {"doc": 1}), not this job; nothing was queued')
    assert "nothing was queued" in one_line_error(
        fairsched("submit", "pdf", "--key", "k", "--config", str(config), url=db), 1)
    assert jobs_in(db) == 1
    # The same job again: numbers compare as jsonb stores them (1e23 comes back an integer).
    args = ("submit", "pdf", "--key", "big", "--payload", '{"c": 1e23}', "--config", str(config))
    first, again = fairsched(*args, url=db), fairsched(*args, url=db)
    assert again.returncode == 0 and again.stdout == first.stdout, again.stderr


def test_a_payload_too_long_for_a_command_line_comes_from_a_file_or_stdin(db, config, tmp_path):
    # An argument holds at most 128 KiB (Linux); a payload may be 512 KiB.
    payload = {"cells": ["x" * 100] * 3000}  # about 310 KB
    path = tmp_path / "payload.json"
    path.write_text(json.dumps(payload))
    from_file = fairsched("submit", "pdf", "--payload", f"@{path}", "--config", str(config),
                          url=db)
    assert from_file.returncode == 0, from_file.stderr
    env = {k: v for k, v in os.environ.items() if k != "FAIRSCHED_CONFIG"}
    from_stdin = subprocess.run(
        [sys.executable, "-m", "fairsched", "submit", "pdf", "--payload", "-", "--config",
         str(config)], input=json.dumps(payload), capture_output=True, text=True,
        env=dict(env, FAIRSCHED_DATABASE_URL=db), timeout=60)
    assert from_stdin.returncode == 0, from_stdin.stderr
    with psycopg.connect(db) as conn:
        stored = conn.execute("SELECT payload FROM fairsched_jobs WHERE id = ANY(%s) ORDER BY id",
                              ([int(from_file.stdout), int(from_stdin.stdout)],)).fetchall()
    assert [row[0] for row in stored] == [payload, payload]


def test_a_payload_on_standard_input_that_never_ends_is_one_line_exit_2(config):
    # Read to its end it would take all the memory there is (here: 2 GiB, then MemoryError).
    # (@/dev/zero is refused as a device: tests/test_cli_read_files.py.)
    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    with open("/dev/zero", "rb") as zeros:
        result = subprocess.run([sys.executable, "-m", "fairsched", "submit", "pdf", "--payload",
                                 "-", "--config", str(config)], stdin=zeros,
                                capture_output=True, text=True, timeout=60,
                                preexec_fn=limit_memory)
    line = one_line_error(result, 2)
    assert "holds more than 64 MiB; a payload takes at most 512 KiB of JSON" in line, line


def test_config_comes_from_fairsched_config_or_the_current_folder(db, config):
    result = fairsched("submit", "pdf", url=db, cwd=config.parent)
    assert result.returncode == 0, result.stderr
    assert jobs_in(db) == 1


@pytest.mark.parametrize("args, message", [
    (["submit", "xls"], "no worker group in "),
    (["submit", "pdf", "--payload", "{oops"], "--payload is not valid JSON"),
    (["submit", "pdf", "--payload", "NaN"], "--payload is not valid JSON: NaN is not a JSON number"),
    (["submit", "pdf", "--payload", '{"a": -Infinity}'],
     "--payload is not valid JSON: -Infinity is not a JSON number"),
    (["submit", "pdf", "--payload", '{"a": 1e400}'],
     "--payload is not valid JSON: 1e400 is out of range for a number"),
    (["submit", "pdf", "--payload", "@"], "--payload @ names no file: give @PATH, or - for"),
    (["submit", "pdf", "--payload", '"\\ud800"'], "payload contains a lone surrogate"),
    (["submit", "pdf", "--payload", "[" * 5000 + "]" * 5000], "--payload nests too deeply"),
    # Valid JSON, which Python's int() would not read: its words advised
    # sys.set_int_max_str_digits().
    (["submit", "pdf", "--payload", '{"n": -' + "7" * 5000 + "}"],
     "--payload holds an integer of 5000 digits, where numbers take at most 4300: send a "
     "longer one as a string"),
    # What was typed comes back as its start and its length, not 5,000 digits on a line.
    (["submit", "pdf", "--priority", "1" * 5000],
     "--priority must be an integer from 0 to 10, got '1111111111111111111111111111111111111111'"
     "... (5000 characters)"),
    (["submit", "pdf", "--delay", "1" * 5000],
     "--delay must be a number of seconds from 0 to 315360000, got '11111111111111111111111111"
     "11111111111111'... (5000 characters)"),
    (["submit", "pdf", "--payload", "[" * 600 + "]" * 600], "payload nests deeper than 500 levels"),
    (["submit", "pdf", "--payload", "[" + ",".join(["1e308"] * 4000) + "]"],
     "payload is 1240001 bytes of JSON once its numbers are written out in full"),
    (["submit", "pdf", "--priority", "11"], "--priority must be an integer from 0 to 10"),
    (["submit", "pdf", "--priority", "high"], "--priority must be an integer from 0 to 10"),
    (["submit", "pdf", "--max-attempts", "0"], "--max-attempts must be an integer"),
    # -0 is refused where 0 is, in the same words.
    (["submit", "pdf", "--max-attempts", "-0"],
     "--max-attempts must be an integer from 1 to 2147483647, got '-0'"),
    (["submit", "pdf", "--on-demand", "--timeout", "-0"],
     "--timeout must be a number of seconds > 0 and at most 315360000, got '-0'"),
    (["jobs", "--limit", "-0"], "--limit must be an integer from 1 to 1000000, got '-0'"),
    (["submit", "pdf", "--priority", "-1"], "--priority must be an integer from 0 to 10, got '-1'"),
    (["submit", "pdf", "--delay", "-0.5"],
     "--delay must be a number of seconds from 0 to 315360000, got '-0.5'"),
    (["submit", "pdf", "--delay", "-"],
     "--delay must be a number of seconds from 0 to 315360000, got '-'"),
    (["submit", "pdf", "--delay", "-5"], "--delay must be a number of seconds"),
    (["submit", "pdf", "--delay", "1_000"],
     "--delay must be a number of seconds from 0 to 315360000, got '1_000'"),
    (["submit", "pdf", "--on-demand", "--timeout", "1_0"],
     "--timeout must be a number of seconds > 0 and at most 315360000, got '1_0'"),
    (["submit", "pdf", "--delay", "inf"],
     "--delay must be a number of seconds from 0 to 315360000, got 'inf'"),
    (["submit", "pdf", "--delay", "1e12"],
     "--delay must be a number of seconds from 0 to 315360000, got '1e12'"),
    (["submit", "pdf", "--on-demand", "--timeout", "0"],
     "--timeout must be a number of seconds > 0 and at most 315360000, got '0'"),
    # A wait no socket can time was a traceback (OverflowError).
    (["submit", "pdf", "--on-demand", "--timeout", "1e308"],
     "--timeout must be a number of seconds > 0 and at most 315360000, got '1e308'"),
    (["submit", "pdf", "--on-demand", "--timeout", "99999999999999999999"],
     "--timeout must be a number of seconds > 0 and at most 315360000, got '9999"),
    (["stop", "--timeout", "inf"], "--timeout must be a number of seconds >= 0, got 'inf'"),
    (["stop", "--timeout", "nan"], "--timeout must be a number of seconds >= 0, got 'nan'"),
    (["jobs", "--status", "done"], "--status must be one of"),
    (["jobs", "--limit", str(2**63)], "--limit must be an integer from 1 to 1000000"),
    (["submit", "pdf", "--key", "k" * 1001], "key is 1001 bytes; at most 1000"),
    (["cancel", "seven"], "ID must be an integer"),
    # A typo must not name another job: only plain ASCII digits are an id.
    (["cancel", "1_0"], "ID must be an integer from 1 to 9223372036854775807, got '1_0'"),
    (["cancel", " 1"], "ID must be an integer"),
    (["retry", "\u0661"], "ID must be an integer"),
    (["submit", "pdf", "--priority", "0_5"], "--priority must be an integer from 0 to 10"),
    (["cancel", "od-4"], "od-4 is an on-demand job: it is in no table"),
    # Only od-N is an on-demand id; anything else after "od-" (a typo, an escape sequence
    # that would clear the terminal) is no id at all.
    (["cancel", "od-x"], "ID must be an integer from 1 to 9223372036854775807, got 'od-x'"),
    (["retry", "od-\x1b[2J"],
     "ID must be an integer from 1 to 9223372036854775807, got 'od-\\x1b[2J'"),
    (["submit", "pdf", "--payload", "@/nonexistent/p.json"],
     "cannot read --payload file '/nonexistent/p.json': No such file or directory"),
])
def test_bad_usage_is_one_line_exit_2_and_writes_nothing(db, config, args, message):
    line = one_line_error(fairsched(*args, "--config", str(config), url=db), 2)
    assert line.startswith("fairsched: ")
    assert message in line
    if args[:2] == ["submit", "xls"]:
        assert "'xls'" in line and "pdf" in line
    assert jobs_in(db) == 0


ID_RULE = "must be an integer from 1 to 9223372036854775807, got "


@pytest.mark.parametrize("text, words", [
    ("seven", f"ID {ID_RULE}'seven'"),
    ("1_0", f"ID {ID_RULE}'1_0'"),
    (" 1", f"ID {ID_RULE}' 1'"),
    ("\u0661", f"ID {ID_RULE}'\u0661'"),
    ("0", f"ID {ID_RULE}'0'"),
    (str(2**63), f"ID {ID_RULE}'{2**63}'"),
    ("od-x", f"ID {ID_RULE}'od-x'"),
    ("od-4", "od-4 is an on-demand job: it is in no table, and it ends when its caller stops "
             "waiting (Ctrl-C on `fairsched submit --on-demand`)"),
])
def test_every_command_that_takes_a_job_id_reads_it_by_the_same_rule(db, config, text, words):
    """jobs, retry, cancel and explain --job refuse the same ids with the same words (explain
    naming its option)."""
    for args in (["jobs", text], ["retry", text], ["cancel", text], ["explain", "--job", text]):
        line = one_line_error(fairsched(*args, "--config", str(config), url=db), 2)
        expected = words.replace("ID ", "--job ", 1) if args[0] == "explain" else words
        assert line == f"fairsched: {expected}", (args, line)
    assert jobs_in(db) == 0


def test_a_broken_config_is_one_line_exit_2(db, tmp_path):
    line = one_line_error(fairsched("jobs", "--config", str(tmp_path / "missing.toml"), url=db), 2)
    assert "missing.toml" in line
    bad = tmp_path / "bad.toml"
    bad.write_text(WORKERS_TOML.replace("types = [\"pdf\", \"ocr\"]", "types = []"))
    line = one_line_error(fairsched("submit", "pdf", "--config", str(bad), url=db), 2)
    assert "types" in line


def test_a_database_setting_that_is_no_url_names_its_file(tmp_path):
    bad = tmp_path / "db.toml"
    bad.write_text(WORKERS_TOML.replace('state_dir = "state"',
                                        'state_dir = "state"\ndatabase = "not a url"'))
    for command in (["jobs"], ["submit", "pdf"], ["supervise"]):
        line = one_line_error(fairsched(*command, "--config", str(bad), url=None), 2)
        assert f"{bad}: [supervisor] key 'database' is not a PostgreSQL URL" in line, line


def test_jobs_shows_a_table_and_json(db, config):
    with queue(db) as q:
        done, failed, waiting = q.enqueue_many(
            [{"type": "pdf"}, {"type": "ocr", "priority": 9}, {"type": "pdf", "delay": 600}])
        q.conn.execute("UPDATE fairsched_jobs SET status = 'succeeded', attempts = 2,"
                       " last_error = 'worker pdf-1 killed by SIGKILL' WHERE id = %s", (done,))
        q.conn.execute("UPDATE fairsched_jobs SET status = 'failed', attempts = 4,"
                       " max_attempts = 4, last_error = %s WHERE id = %s",
                       ("ValueError: page 3 is empty\nTraceback ...", failed))
    result = fairsched("jobs", "--config", str(config), url=db)
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["ID", "TYPE", "PRI", "STATUS", "ATTEMPTS", "AGE", "LAST", "ERROR"]
    assert [row.split()[0] for row in rows] == [str(waiting), str(failed), str(done)]
    assert "pending (in 9m" in rows[0] or "pending (in 10m" in rows[0]
    assert rows[1].split()[:5] == [str(failed), "ocr", "9", "failed", "4"]
    assert rows[1].endswith("ValueError: page 3 is empty")
    assert "0/4" in rows[0].split()  # not claimed yet: the max_attempts it will get
    assert rows[2].endswith("(an earlier attempt) worker pdf-1 killed by SIGKILL")

    result = fairsched("jobs", "--status", "failed", "--json", "--config", str(config), url=db)
    (job,) = json.loads(result.stdout)
    assert (job["id"], job["status"], job["attempts"]) == (failed, "failed", 4)
    assert job["created_at"].endswith("+00:00")

    result = fairsched("jobs", "--type", "pdf", "--json", "--config", str(config), url=db)
    assert [j["id"] for j in json.loads(result.stdout)] == [waiting, done]


def test_jobs_lines_up_wide_types_and_keeps_text_as_it_is(db, config):
    from fairsched.cli.common import display_width

    long_type = "render-" + "x" * 40
    with queue(db) as q:  # types no enqueue takes, as written by hand or by an older version
        q.conn.execute("INSERT INTO fairsched_jobs (type, payload) SELECT t, p FROM"
                       " unnest(%s::text[], %s::jsonb[]) WITH ORDINALITY AS u(t, p, n) ORDER BY n",
                       (["文書", "pdf", "😀x", "e\u0301", long_type],
                        ['{"title": "café"}', None, None, None, None]))
    cli = [f"--config={config}"]
    result = fairsched("jobs", *cli, url=db)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(line == line.rstrip() for line in lines)  # no trailing spaces
    # Every row's STATUS starts in the header's column, in terminal columns.
    starts = {display_width(line[:line.index(word)])
              for line, word in zip(lines, ["STATUS"] + ["pending"] * 5, strict=True)}
    assert len(starts) == 1, result.stdout
    cut = lines[1].split()[1]
    assert cut == long_type[:23] + "…" and display_width(cut) == 24
    assert lines[1].index("pending") < 40
    result = fairsched("jobs", "--json", *cli, url=db)
    assert '"café"' in result.stdout and '"文書"' in result.stdout
    assert [j["claims"] for j in json.loads(result.stdout)] == [0] * 5


def on_a_terminal(*args: str, url: str, columns: int) -> str:
    """What `fairsched ARGS` prints with its standard output on a terminal `columns` wide."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("FAIRSCHED_CONFIG", "COLUMNS", "TERM")}
    env.update(FAIRSCHED_DATABASE_URL=url, TERM="xterm-256color")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    with subprocess.Popen([sys.executable, "-m", "fairsched", *args], env=env, stdout=slave,
                          stderr=subprocess.PIPE) as proc:
        os.close(slave)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the command has exited, and its terminal with it
                break
            if not chunk:
                break
            seen += chunk
        os.close(master)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    return seen.decode().replace("\r\n", "\n")


def test_jobs_on_a_terminal_cuts_the_last_error_at_its_edge(db, config):
    """On 80 columns a 60-column error wrapped its row; on a wide terminal it was cut at 60
    all the same. Into a pipe it still is."""
    error = "PermanentError: " + "/".join(["a-long-folder"] * 8) + "/report.pdf: not a PDF"
    with queue(db) as q:
        (failed,) = q.enqueue_many([{"type": "pdf"}])
        q.conn.execute("UPDATE fairsched_jobs SET status = 'failed', attempts = 1,"
                       " last_error = %s WHERE id = %s", (error, failed))
    narrow = on_a_terminal("jobs", "--config", str(config), url=db, columns=80)
    header, row = narrow.splitlines()
    # Cut in the middle: what failed, and why.
    assert len(row) <= 80 and "PermanentError: …" in row, row
    assert row.endswith("/report.pdf: not a PDF") and len(row) > 76, row
    wide = on_a_terminal("jobs", "--config", str(config), url=db, columns=200)
    assert wide.splitlines()[1].endswith(error), wide
    piped = fairsched("jobs", "--config", str(config), url=db).stdout.splitlines()[1]
    cell = piped[piped.index("PermanentError"):]
    assert cell.startswith("PermanentError: …") and error.endswith(cell.split("…")[1]), piped
    assert len(cell) == 60, piped


def test_retry_and_cancel(db, config):
    with queue(db) as q:
        failed, pending, running, finished = q.enqueue_many([{"type": "pdf"}] * 4)
        for job_id, status in ((failed, "failed"), (running, "running"), (finished, "succeeded")):
            q.conn.execute("UPDATE fairsched_jobs SET status = %s, attempts = 1 WHERE id = %s",
                           (status, job_id))

    def cli(*args):
        return fairsched(*args, "--config", str(config), url=db)

    result = cli("retry", str(failed))
    assert (result.returncode, result.stdout) == (0, f"job {failed} is pending again\n")
    assert f"job {pending} is pending" in one_line_error(cli("retry", str(pending)), 1)
    assert "no job with id 4242" in one_line_error(cli("retry", "4242"), 1)

    result = cli("cancel", str(pending))
    assert (result.returncode, result.stdout) == (0, f"job {pending} cancelled\n")
    result = cli("cancel", str(running))
    assert (result.returncode, result.stdout) == (0, f"job {running} is running: cancel requested\n")
    assert f"job {finished} already succeeded" in one_line_error(cli("cancel", str(finished)), 1)
    assert "no job with id 4242" in one_line_error(cli("cancel", "4242"), 1)

    with queue(db) as q:
        assert q.get_job(failed)["status"] == "pending"
        assert q.get_job(pending)["status"] == "cancelled"
        assert q.get_job(running)["cancel_requested"]


@pytest.mark.parametrize("url", ["postgresql://x@/db?host=/nonexistent&password=s3cret",
                                 "host=/nonexistent dbname=db user=x password=s3cret"])
def test_an_unreachable_database_is_one_line_exit_1_without_its_password(config, url):
    line = one_line_error(fairsched("jobs", "--config", str(config), url=url), 1)
    assert "cannot connect to PostgreSQL" in line
    assert "s3cret" not in line and "password=***" in line


@pytest.mark.parametrize("url", ["postgresql://u:s3cret@[::1/db",
                                 "http://u:s3cret@db.example/db",
                                 "postgresql://u:s3cret%ZZ@db.example/db",
                                 "postgresql://u@db.example/db?password=s3cret%ZZ"])
def test_a_database_url_that_does_not_parse_is_one_line_exit_2_without_its_password(config,
                                                                                    url):
    for command in (["jobs"], ["submit", "pdf"], ["supervise"]):
        line = one_line_error(fairsched(*command, "--config", str(config), url=url), 2)
        assert "FAIRSCHED_DATABASE_URL is not a PostgreSQL URL" in line, line
        assert "s3cret" not in line, line
    bad = config.parent / "db.toml"
    bad.write_text(WORKERS_TOML.replace('state_dir = "state"',
                                        f'state_dir = "state"\ndatabase = "{url}"'))
    line = one_line_error(fairsched("jobs", "--config", str(bad), url=None), 2)
    assert "key 'database' is not a PostgreSQL URL" in line and "s3cret" not in line, line


def test_embedded_database_without_any_url(reused_state_dir):
    config = reused_state_dir.parent / "workers.toml"  # its state_dir is "state"
    config.write_text(WORKERS_TOML)
    result = fairsched("submit", "ocr", "--config", str(config), url=None)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    job_id = int(result.stdout)
    result = fairsched("jobs", "--json", "--config", str(config), url=None)
    assert {j["id"]: j["type"] for j in json.loads(result.stdout)}[job_id] == "ocr"
    # Each command started the server for itself and stopped it again.
    assert not (reused_state_dir / "pg" / "postmaster.pid").exists()


def test_ctrl_c_while_a_command_starts_the_embedded_database_stops_it_too(reused_state_dir):
    # The server is up (its postmaster.pid written) before pg_ctl says so: a command
    # interrupted in between must still stop the server it started, as any other exit does.
    # The server is held (SIGSTOP) from its pid file on, so it cannot become ready: the
    # command surely is in between, waiting for pg_ctl, when the Ctrl-C lands.
    config = reused_state_dir.parent / "workers.toml"
    config.write_text(WORKERS_TOML)
    env = {k: v for k, v in os.environ.items() if k != "FAIRSCHED_DATABASE_URL"}
    pid_file = reused_state_dir / "pg" / "postmaster.pid"
    command = subprocess.Popen([sys.executable, "-m", "fairsched", "jobs", "--config",
                                str(config)], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    postmaster = None

    def pid_written() -> int | None:
        """The server's pid (not the negative one of `postgres --single`, setting the
        password before)."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int(pid_file.read_text().splitlines()[0])
            return pid if pid > 0 else None
        return None

    try:
        postmaster = psutil.Process(wait_until(pid_written, timeout=30, interval=0.001,
                                               what="the server's pid file"))
        postmaster.suspend()
        lines = pid_file.read_text().splitlines()
        assert lines[7:8] != ["ready"], "the server was ready before it could be held"
        (pg_ctl,) = [p for p in psutil.Process(command.pid).children() if p.name() == "pg_ctl"]
        command.send_signal(signal.SIGINT)
        # The command has taken the Ctrl-C once it has killed the pg_ctl it waited for.
        wait_until(lambda: not alive(pg_ctl.pid), what="pg_ctl killed by the command")
        postmaster.resume()  # to take the command's stop
        out, err = command.communicate(timeout=30)
    finally:
        with contextlib.suppress(psutil.Error):
            if postmaster is not None:
                postmaster.resume()
        command.kill()
        command.wait()
    assert command.returncode == 130, err
    assert "Traceback" not in err and err.endswith("fairsched: interrupted\n"), err
    wait_until(lambda: not pid_file.exists(), timeout=10,
               what="the embedded PostgreSQL stopped with the command that started it")


def test_commands_beside_a_running_supervisor_leave_its_database_up(reused_state_dir):
    config = reused_state_dir.parent / "workers.toml"
    config.write_text(WORKERS_TOML)
    env = {k: v for k, v in os.environ.items() if k != "FAIRSCHED_DATABASE_URL"}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER_SCRIPT, str(config)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        url = holder.stdout.readline().strip()
        assert url.startswith("postgresql://")
        pid_file = reused_state_dir / "pg" / "postmaster.pid"
        postmaster = pid_file.read_text().split()[0]
        job_id = int(fairsched("submit", "pdf", "--config", str(config), url=None).stdout)
        assert fairsched("cancel", str(job_id), "--config", str(config), url=None).returncode == 0
        assert pid_file.read_text().split()[0] == postmaster
        with queue(url) as q:  # the supervisor's server still answers
            assert q.get_job(job_id)["status"] == "cancelled"
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(30) == 0
        assert not pid_file.exists()
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()
        holder.stdin.close()
        holder.stdout.close()


def test_queue_commands_beside_a_supervisor_on_an_external_database_refuse(supervisors, db,
                                                                         monkeypatch):
    # The supervisor has its database's URL from its environment; a command run without it
    # would start an empty embedded database in the same state_dir, which nothing reads.
    sup = supervisors('[[worker]]\nname = "pdf"\ntypes = ["pdf"]\n'
                      'handler = "sup_handlers:echo"\n').start()
    pid = sup.ps()["supervisor"]["pid"]
    commands = (["submit", "pdf"], ["jobs"], ["retry", "1"], ["cancel", "1"],
                ["explain", "--job", "1"])
    for command in commands:
        line = one_line_error(fairsched(*command, "--config", str(sup.config), url=None), 2)
        assert line == (f"fairsched: the supervisor (pid {pid}) on {sup.dir / 'state'} uses an "
                        "external database; give this command its URL with "
                        f"FAIRSCHED_DATABASE_URL or `[supervisor] database` in {sup.config}")
    assert not (sup.dir / "state" / "pg").exists()
    # An embedded database left from an earlier setup is not taken for the supervisor's.
    (sup.dir / "state" / "pg").mkdir()
    one_line_error(fairsched("submit", "pdf", "--config", str(sup.config), url=None), 2)
    monkeypatch.delenv("FAIRSCHED_DATABASE_URL", raising=False)
    with pytest.raises(OtherDatabase, match=f"the supervisor \\(pid {pid}\\)"):
        Queue.open(sup.config)  # the Python API alike
    assert jobs_in(db) == 0
    submitted = fairsched("submit", "pdf", "--config", str(sup.config), url=db)
    assert submitted.returncode == 0, submitted.stderr


def test_queue_commands_after_a_supervisor_on_an_external_database_stopped_refuse(
        supervisors, db, monkeypatch):
    # Run without the URL while the supervisor is down (restarting, say), a command would
    # start an empty embedded database in its state_dir and queue there, for no one.
    sup = supervisors('[[worker]]\nname = "pdf"\ntypes = ["pdf"]\n'
                      'handler = "sup_handlers:echo"\n').start()
    assert sup.cli("stop").returncode == 0
    state = sup.dir / "state"
    for command in (["submit", "pdf"], ["jobs"]):
        line = one_line_error(fairsched(*command, "--config", str(sup.config), url=None), 2)
        assert line == (f"fairsched: the supervisor on {state} used an external database when "
                        "it last ran; give this command its URL with FAIRSCHED_DATABASE_URL or "
                        f"`[supervisor] database` in {sup.config} (or remove "
                        f"{state / 'external-database'} to start an embedded database there)")
    assert not (state / "pg").exists()
    monkeypatch.delenv("FAIRSCHED_DATABASE_URL", raising=False)
    with pytest.raises(OtherDatabase, match="used an external database when it last ran"):
        Queue.open(sup.config)  # the Python API alike
    assert jobs_in(db) == 0
    assert fairsched("submit", "pdf", "--config", str(sup.config), url=db).returncode == 0


def test_the_readmes_python_example_runs_as_written(db):
    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    after = readme.split("Enqueue from Python with `fairsched.Queue`:", 1)[1]
    code = after.split("```python\n", 1)[1].split("```", 1)[0]
    env = dict(os.environ, FAIRSCHED_DATABASE_URL=db)
    result = subprocess.run([sys.executable, "-c", code], cwd=root, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    with psycopg.connect(db) as conn:
        rows = conn.execute("SELECT type, priority FROM fairsched_jobs ORDER BY id").fetchall()
    assert rows == [("pdf", 5), ("excel", 0), ("excel", 0)]



FROZEN_COMMANDS = [["submit", "pdf"], ["jobs"], ["retry", "1"], ["cancel", "1"],
                   ["explain", "--job", "1"]]


@pytest.mark.parametrize("command", FROZEN_COMMANDS, ids=[c[0] for c in FROZEN_COMMANDS])
def test_a_database_that_stops_answering_is_one_line_exit_1_after_the_timeout(db, config,
                                                                               command):
    from tests.pg_proxy import PgProxy

    with queue(db) as q:
        q.cancel_job(q.enqueue("pdf"))  # job 1: one every command can take
    proxy = PgProxy(db)
    try:
        proxy.lose_answer_to(b"fairsched_jobs")  # connected, then the server goes silent
        env = dict(os.environ, FAIRSCHED_DATABASE_URL=proxy.url_through,
                   FAIRSCHED_DATABASE_TIMEOUT="2")
        env.pop("FAIRSCHED_CONFIG", None)
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "fairsched", *command, "--config",
                                 str(config)], capture_output=True, text=True, env=env,
                                timeout=60)
        took = time.monotonic() - started
    finally:
        proxy.close()
    line = one_line_error(result, 1)
    assert f"PostgreSQL at {proxy.url_through} did not answer within 2 s" in line, line
    assert "FAIRSCHED_DATABASE_TIMEOUT" in line, line
    assert took < 20, took


def test_a_server_that_never_takes_the_connection_is_one_line_exit_1(config, tmp_path):
    import socket

    folder = Path(tempfile.mkdtemp(prefix="fs-", dir="/tmp"))
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(folder / ".s.PGSQL.5432"))
        listener.listen(8)  # connections wait in the backlog: nothing ever answers them
        env = dict(os.environ, FAIRSCHED_DATABASE_URL=f"host={folder} dbname=db user=x",
                   FAIRSCHED_DATABASE_TIMEOUT="2")
        result = subprocess.run([sys.executable, "-m", "fairsched", "jobs", "--config",
                                 str(config)], capture_output=True, text=True, env=env,
                                timeout=60)
    finally:
        listener.close()
        shutil.rmtree(folder)
    line = one_line_error(result, 1)
    assert "cannot connect to PostgreSQL" in line and "connection timeout expired" in line, line
    assert "after 2 s; FAIRSCHED_DATABASE_TIMEOUT" in line, line


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan", "1e9"])
def test_a_database_timeout_that_is_no_duration_is_one_line_exit_2(db, config, value):
    env = dict(os.environ, FAIRSCHED_DATABASE_URL=db, FAIRSCHED_DATABASE_TIMEOUT=value)
    result = subprocess.run([sys.executable, "-m", "fairsched", "jobs", "--config",
                             str(config)], capture_output=True, text=True, env=env, timeout=60)
    line = one_line_error(result, 2)
    assert (f"FAIRSCHED_DATABASE_TIMEOUT must be a number of seconds > 0 and at most 86400, "
            f"got {value!r}") in line


@pytest.mark.parametrize("args", [["jobs"], ["jobs", "--json"], ["explain"],
                                  ["simulate", "trace.jsonl"], ["ps"],
                                  ["submit", "pdf", "--on-demand"]])
def test_a_command_whose_output_cannot_be_written_says_so(db, config, args):
    # Standard output closed (`>&-`): the command ended at once, said nothing, exit 0; on a
    # full disk it said a bare "No space left on device". Said before the supervisor is asked.
    (config.parent / "trace.jsonl").write_text('{"at": 0, "type": "pdf", "duration": 1}\n')
    env = {k: v for k, v in os.environ.items() if k != "FAIRSCHED_CONFIG"}
    env["FAIRSCHED_DATABASE_URL"] = db
    command = [sys.executable, "-m", "fairsched", *args, "--config", str(config)]
    closed = subprocess.run(command, env=env, cwd=config.parent, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, timeout=60,
                            preexec_fn=lambda: os.close(1))
    assert (closed.returncode, closed.stderr) == (
        1, "fairsched: cannot write to standard output: Bad file descriptor\n")
    if args[0] in ("ps", "submit"):  # no supervisor runs: nothing more to write
        return
    with open("/dev/full", "w") as full:
        result = subprocess.run(command, env=env, cwd=config.parent, stdout=full,
                                stderr=subprocess.PIPE, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (
        1, "fairsched: cannot write to standard output: No space left on device\n")


def test_a_submit_whose_id_cannot_be_printed_says_the_job_was_queued(db, config):
    # Standard output on a full disk, or closed: the job is in the table all the same, and a
    # bare "No space left on device" would have the user submit it again.
    env = {k: v for k, v in os.environ.items() if k != "FAIRSCHED_CONFIG"}
    env["FAIRSCHED_DATABASE_URL"] = db
    args = [sys.executable, "-m", "fairsched", "submit", "pdf", "--config", str(config)]
    with open("/dev/full", "w") as full:
        result = subprocess.run(args, env=env, stdout=full, stderr=subprocess.PIPE, text=True,
                                timeout=60)
    closed = subprocess.run(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, timeout=60, preexec_fn=lambda: os.close(1))
    with queue(db) as q:
        first, second = sorted(job["id"] for job in q.list_jobs())
    assert (result.returncode, result.stderr) == (
        1, f"fairsched: job {first} was queued, but its id could not be printed:"
           " No space left on device\n")
    assert (closed.returncode, closed.stderr) == (
        1, f"fairsched: job {second} was queued, but its id could not be printed:"
           " standard output is closed\n")
