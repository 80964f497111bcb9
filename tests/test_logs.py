"""`fairsched supervise --log-format json`: every line a log shipper reads is one JSON object."""

import functools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from fairsched.logs import TEXT_FORMAT, TextFormatter
from tests.supervisor_harness import Supervisor, wait_until

WORKERS = """
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:echo"

[[worker]]
name = "flaky"
types = ["flaky"]
handler = "sup_handlers:fail"
max_attempts = 2
retry_backoff = 0.2

[[worker]]
name = "broken"
types = ["broken"]
handler = "no_such_module:run"
"""


class JsonLogged(Supervisor):
    """A supervisor whose stderr (the log) and stdout are kept apart."""

    def __init__(self, *args, log_level: str = "info", **kwargs):
        super().__init__(*args, **kwargs)
        self.log_level = log_level
        self.stdout_path = self.dir / "stdout"
        self._stdout = None

    def start(self, wait: bool = True) -> "JsonLogged":
        self._logf = open(self.log, "ab")
        self._stdout = open(self.stdout_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fairsched", "supervise", "--config", str(self.config),
             "--log-format", "json", "--log-level", self.log_level],
            stdout=self._stdout, stderr=self._logf, env=self.env)
        if wait:
            self.wait_for(lambda ps: all(s["state"] in ("free", "busy", "fatal")
                                         for s in ps["slots"]), what="all workers ready")
        return self

    def entries(self) -> list[dict]:
        """Every stderr line, parsed; fails on the first line that is not a JSON object."""
        entries = []
        for number, line in enumerate(self.output().splitlines(), 1):
            try:
                entry = json.loads(line)
            except ValueError:
                raise AssertionError(f"log line {number} is not JSON: {line!r}") from None
            assert isinstance(entry, dict), line
            assert {"time", "level", "logger", "message"} <= entry.keys(), line
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["time"]), line
            entries.append(entry)
        return entries

    def find(self, pattern: str, level: str | None = None) -> list[re.Match]:
        found = []
        for entry in self.entries():
            match = re.search(pattern, entry["message"])
            if match and level in (None, entry["level"]):
                found.append(match)
        return found

    def wait_log(self, pattern: str, timeout: float = 20.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.find(pattern)
            if found:
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no log line matches {pattern!r}:\n{self.output()[-3000:]}")

    def close(self) -> None:
        if self._stdout is not None:
            self._stdout.close()
        super().close()


@pytest.fixture
def supervisors(supervisors):
    return functools.partial(supervisors, cls=JsonLogged)


def test_job_and_worker_lines_are_json(supervisors):
    sup = supervisors(WORKERS).start()
    fatal = sup.wait_log(r"worker broken-1 is fatal: could not start: (.*); "
                         r"run `fairsched restart broken-1` once fixed")
    assert "no_such_module" in fatal.group(1)
    assert sup.find(r"worker broken-1 is fatal", level="error")

    queued = sup.cli("submit", "pdf", "--payload", '{"n": 1}')
    assert queued.returncode == 0, queued.stderr
    job_id = queued.stdout.strip()
    sup.wait_log(rf"job {job_id} succeeded: type pdf, worker pdf-1, slot 0, attempt 1, "
                 r"\d+\.\d{3} s")
    started = sup.find(rf"job {job_id} started: type pdf, worker pdf-1, slot 0, attempt 1/3, "
                       r"waited (\d+\.\d{3}) s", level="info")
    assert len(started) == 1

    on_demand = sup.cli("submit", "pdf", "--on-demand")
    assert on_demand.returncode == 0, on_demand.stderr
    assert sup.find(r"job od-1 started: type pdf, worker pdf-1, slot 0, attempt 1/3")
    assert sup.find(r"job od-1 succeeded: type pdf, worker pdf-1")

    flaky = sup.cli("submit", "flaky").stdout.strip()
    retry = sup.wait_log(rf"job {flaky} failed: type flaky, worker flaky-1, slot 0, attempt 1, "
                         r"\d+\.\d{3} s: RuntimeError: failing on purpose \(attempt 1\); "
                         r"retry in (\d+\.\d) s")
    assert 0.1 <= float(retry.group(1)) <= 0.2  # equal jitter: between half and all of the base
    sup.wait_log(rf"job {flaky} failed for good: type flaky, worker flaky-1, slot 0, attempt 2, "
                 r"\d+\.\d{3} s: RuntimeError: failing on purpose \(attempt 2\)")
    assert sup.find(rf"job {flaky} failed for good", level="warning")

    first = sup.slots("pdf")[0]["pid"]
    assert sup.find(rf"worker pdf-1 spawned \(pid {first}\)", level="info")
    os.kill(first, signal.SIGKILL)
    sup.wait_log(r"worker pdf-1 killed by SIGKILL from outside fairsched \(not the OOM killer\); "
                 r"restarting in 0 s")
    row = sup.wait_for(lambda ps: [s for s in ps["slots"] if s["group"] == "pdf"
                                   and s["state"] == "free" and s["pid"] != first],
                       what="pdf-1 back")
    second = next(s["pid"] for s in row["slots"] if s["group"] == "pdf")
    sup.wait_log(rf"worker pdf-1 spawned \(pid {second}\)")
    sup.wait_log(rf"worker pdf-1 ready \(pid {second}, 1 slot, types pdf\)")

    assert sup.cli("stop").returncode == 0
    assert sup.wait_exit() == 0
    assert sup.find(r"^supervisor stopped$")
    entries = sup.entries()  # after the last line: every one of them parses
    assert sup.find(r"^supervisor \d+ started \(pid \d+, fairsched [0-9.]+, core (c|python), database external, "
                    r"3 workers\)$", level="info")
    assert {e["logger"] for e in entries} <= {"fairsched.supervisor", "fairsched.queue",
                                             "fairsched.control", "fairsched.metrics"}
    assert sup.stdout_path.read_bytes() == b""

    # The same events as structured fields, for log pipelines.
    finished = [e for e in entries if e.get("event") == "job_finished"]
    assert {"job_id": int(job_id), "type": "pdf", "worker": "pdf-1", "slot": 0, "attempt": 1,
            "outcome": "succeeded"}.items() <= next(e for e in finished
                                                    if e["job_id"] == int(job_id)).items()
    retried = next(e for e in finished if e["job_id"] == int(flaky) and e["attempt"] == 1)
    assert retried["outcome"] == "retried" and 0.1 <= retried["retry_in"] <= 0.2
    assert retried["error"] == "RuntimeError: failing on purpose (attempt 1)"
    assert all(isinstance(e["duration"], float) for e in finished)
    exited = next(e for e in entries if e.get("event") == "worker_exited")
    assert exited["worker"] == "pdf-1" and exited["exit"].startswith("killed by SIGKILL")
    assert any(e.get("event") == "worker_fatal" and e["worker"] == "broken-1" for e in entries)
    ready = next(e for e in entries if e.get("event") == "worker_ready" and e["worker"] == "pdf-1")
    assert {"group": "pdf", "slots": 1, "types": ["pdf"]}.items() <= ready.items(), ready
    # Every exit is a worker_exited: a crash, and each worker's stop at shutdown.
    stopped = {e["worker"] for e in entries
               if e.get("event") == "worker_exited" and e.get("restart_in") is None}
    assert "pdf-1" in stopped, entries


def test_log_level_warning_keeps_only_problems(supervisors):
    sup = supervisors(WORKERS, log_level="warning").start()
    sup.wait_log(r"worker broken-1 is fatal")
    assert sup.cli("submit", "pdf", "--on-demand").returncode == 0
    assert sup.cli("stop").returncode == 0
    assert sup.wait_exit() == 0
    levels = {e["level"] for e in sup.entries()}
    assert levels <= {"warning", "error"} and "error" in levels
    assert not sup.find(r"job od-1")


def test_log_level_debug_shows_the_queue_at_work(supervisors, db):
    sup = supervisors(WORKERS, log_level="debug").start()
    job_id = int(sup.cli("submit", "pdf").stdout)
    sup.wait_log(rf"job {job_id} succeeded")
    assert sup.find(r"^fetched 1 candidates? for (.*, )?pdf \(1 free\)", level="debug")
    assert sup.find(r"^claimed 1 of 1 job$", level="debug")


def test_children_exiting_during_shutdown_leave_stderr_clean(supervisors):
    """A SIGCHLD that lands while the event loop closes must not print raw CPython lines."""
    for _ in range(3):
        sup = supervisors(WORKERS, log_level="warning").start()
        sup.signal(signal.SIGTERM)

        def flooded_until_gone(sup=sup) -> bool:
            """One more SIGCHLD, unless the supervisor has exited."""
            try:
                os.kill(sup.proc.pid, signal.SIGCHLD)
            except ProcessLookupError:
                return True
            return sup.proc.poll() is not None

        wait_until(flooded_until_gone, timeout=30, interval=0.0005,
                   what="the supervisor exiting through a flood of SIGCHLD")
        assert sup.wait_exit() == 0
        assert sup.entries()  # every line of stderr is a JSON object


def test_an_error_of_several_lines_stays_on_one_line(supervisors):
    sup = supervisors("""
[[worker]]
name = "bad"
types = ["bad"]
handler = "sup_handlers:fail_permanently"
""").start()
    result = sup.cli("submit", "bad", "--on-demand", "--payload",
                     json.dumps({"why": "first line\nsecond line\u0000"}))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "fairsched: job od-1 failed: PermanentError: first line\\nsecond line\\0"], result.stderr
    (line,) = [ln for ln in sup.output().splitlines() if "failed for good" in ln]
    assert json.loads(line)["error"] == "PermanentError: first line\nsecond line\0"


def test_the_text_format_keeps_a_record_on_one_line():
    formatter = TextFormatter(TEXT_FORMAT)
    record = logging.LogRecord("fairsched.supervisor", logging.WARNING, __file__, 1,
                               "job %s failed: %s", ("od-1", "boom\nsecond\r\nthird\0"), None)
    assert formatter.format(record).endswith("job od-1 failed: boom\\nsecond\\nthird\\0")


def test_the_text_format_spells_out_what_a_terminal_would_act_on():
    formatter = TextFormatter(TEXT_FORMAT)
    record = logging.LogRecord("fairsched.supervisor", logging.WARNING, __file__, 1,
                               "job %s failed: %s", ("1", "a\x1b[2Jb\x07c\u2028d\x85e\x0bf\tg é"),
                               None)
    line = formatter.format(record)
    assert line.endswith("job 1 failed: a\\x1b[2Jb\\x07c\\u2028d\\x85e\\x0bf\tg é"), line
    assert len(line.splitlines()) == 1


def test_a_handlers_escape_sequence_reaches_the_text_log_spelled_out(db):
    sup = Supervisor(db, """
[[worker]]
name = "bad"
types = ["bad"]
handler = "sup_handlers:fail_permanently"
""")
    try:
        sup.start()
        result = sup.cli("submit", "bad", "--on-demand", "--payload",
                         json.dumps({"why": "\x1b]0;owned\x07\x1b[2Jcleared\u2028next"}))
        assert result.returncode == 1
        (line,) = [ln for ln in sup.output().splitlines() if "failed for good" in ln]
        assert "PermanentError: \\x1b]0;owned\\x07\\x1b[2Jcleared\\u2028next" in line, line
        assert "\x1b" not in sup.output()
    finally:
        sup.close()


def supervise_json_with(tmp_path, run: str) -> subprocess.CompletedProcess:
    """`fairsched supervise --log-format json` whose run_supervisor is `run`: code that
    defines `run(config)`."""
    config = tmp_path / "workers.toml"
    config.write_text('[[worker]]\nname = "a"\ntypes = ["a"]\ncommand = ["true"]\n')
    code = (
        run + "import fairsched.supervisor.main as m\n"
        "m.run_supervisor = run\n"
        "from fairsched.cli import main\n"
        f"main(['supervise', '--config', {str(config)!r}, '--log-format', 'json'])\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)


def test_a_supervisor_bug_is_logged_in_the_logs_format(tmp_path):
    proc = supervise_json_with(tmp_path, "def run(config):\n    raise RuntimeError('a bug')\n")
    assert proc.returncode == 1
    (line,) = proc.stderr.splitlines()
    entry = json.loads(line)
    assert entry["message"] == "the supervisor failed: a bug"
    assert "RuntimeError: a bug" in entry["exception"]


@pytest.mark.parametrize("flags", [["--log-format", "json"],
                                   ["--log-format", "JSON", "--log-level", "Warning"]])
def test_a_bad_config_is_told_in_the_logs_format(tmp_path, flags):
    config = tmp_path / "workers.toml"
    config.write_text('[supervisor]\nlease = 0\n[[worker]]\nname = "a"\ntypes = ["a"]\n'
                      'command = ["true"]\n')
    proc = subprocess.run([sys.executable, "-m", "fairsched", "supervise", "--config", str(config),
                           *flags], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    entry = json.loads(line)
    assert entry["level"] == "error", entry
    assert "[supervisor] key 'lease' must be >= 1, got 0" in entry["message"], entry


def test_a_field_named_as_a_key_of_the_json_line_leaves_that_key_alone(tmp_path):
    proc = supervise_json_with(tmp_path, (
        "import logging\n"
        "from fairsched.logs import fields\n"
        "def run(config):\n"
        "    logging.getLogger('fairsched.supervisor').info('job %s started', 7, extra=fields(\n"
        "        time='then', level='error', logger='elsewhere', message='forged',\n"
        "        exception='none', field_level='kept', job_id=7))\n"
        "    try:\n"
        "        raise RuntimeError('a bug')\n"
        "    except RuntimeError:\n"
        "        logging.getLogger('fairsched.supervisor').exception(\n"
        "            'it failed', extra=fields(exception='forged'))\n"
        "    return 0\n"))
    assert proc.returncode == 0, proc.stderr
    first, second = (json.loads(line) for line in proc.stderr.splitlines())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["time"]), first
    assert first == {
        "time": first["time"], "level": "info", "logger": "fairsched.supervisor",
        "message": "job 7 started", "field_time": "then", "field_field_level": "error",
        "field_logger": "elsewhere", "field_message": "forged", "field_exception": "none",
        "field_level": "kept", "job_id": 7}, first
    assert second["message"] == "it failed" and second["field_exception"] == "forged"
    assert "RuntimeError: a bug" in second["exception"], second


def test_a_lone_surrogate_in_an_error_is_spelled_out_in_the_json_line(supervisors):
    # "\ud800" in a JSON string is a broken UTF-16 pair: strict parsers refuse the whole line.
    sup = supervisors("""
[[worker]]
name = "odd"
types = ["odd"]
handler = "sup_handlers:awkward"
max_attempts = 1
""").start()
    result = sup.cli("submit", "odd", "--on-demand", "--payload", '{"do": "error"}')
    assert result.returncode == 1
    (line,) = [ln for ln in sup.output().splitlines() if "failed for good" in ln]
    assert "\\ud800" not in line.replace("\\\\ud800", ""), line  # no escape of a surrogate
    entry = json.loads(line)
    assert entry["error"] == "RuntimeError: a broken \\ud800 pair and a NUL \x00", entry
    assert entry["message"].endswith(entry["error"]), entry
    line.encode("ascii")
    entry["message"].encode("utf-8")  # every string is whole Unicode


def test_job_lines_carry_the_group_of_their_worker(supervisors):
    # A log pipeline that routes by group sees a group's jobs as well as its workers.
    sup = supervisors(WORKERS).start()
    assert sup.cli("submit", "pdf", "--on-demand").returncode == 0
    job_id = int(sup.cli("submit", "flaky").stdout)
    sup.wait_log(rf"job {job_id} failed for good")
    entries = [e for e in sup.entries() if e.get("event") in ("job_started", "job_finished")]
    assert len(entries) == 6, entries
    for entry in entries:
        assert entry["group"] == entry["worker"].rpartition("-")[0], entry
