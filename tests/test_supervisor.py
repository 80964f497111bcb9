"""The supervisor as an operator meets it: real workers, real signals, driven through the CLI."""

import contextlib
import json
import os
import re
import resource
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import psycopg
import pytest

from tests.supervisor_harness import alive, read_until, sleeping, wait_until

ECHO = """
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:echo"
"""


SLOW_PDF = """
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:slow"
"""  # one process, one slot; settings may follow


def test_on_demand_result_error_and_unknown_type(supervisors):
    sup = supervisors(ECHO + """
[[worker]]
name = "bad"
types = ["bad"]
handler = "sup_handlers:fail_permanently"
""").start()
    ok = sup.cli("submit", "pdf", "--on-demand", "--payload", '{"n": 7}')
    assert ok.returncode == 0, ok.stderr
    result = json.loads(ok.stdout)
    assert result["payload"] == {"n": 7} and result["type"] == "pdf"
    assert result["pid"] == sup.slots("pdf")[0]["pid"]

    failed = sup.cli("submit", "bad", "--on-demand")
    assert failed.returncode == 1
    assert "this input can never work" in failed.stderr

    # Asked to wait or to queue, a type no group runs is refused in the same words.
    expected = (f"fairsched: no worker group in {sup.config} runs type 'video'"
                " (configured types: bad, pdf)\n")
    for args in (("--on-demand",), ()):
        unknown = sup.cli("submit", "video", *args)
        assert (unknown.returncode, unknown.stdout, unknown.stderr) == (2, "", expected), args


def test_status_78_after_the_hello_is_a_crash_not_a_start_that_failed(supervisors):
    sup = supervisors("""
[[worker]]
name = "ex"
types = ["ex"]
handler = "sup_handlers:exits"
max_attempts = 1
""").start()
    pid = sup.slots("ex")[0]["pid"]
    result = sup.cli("submit", "ex", "--on-demand", "--payload", '{"code": 78}')
    assert result.returncode == 1
    assert "exited with code 78" in result.stderr, result.stderr
    slot = sup.wait_for(lambda ps: ps["slots"][0]["pid"] not in (None, pid)
                        and ps["slots"][0]["state"] == "free", what="the worker back")["slots"][0]
    assert slot["restarts"] == 1 and slot["last_exit"] == "exited with code 78", slot
    assert "could not start" not in sup.output()


def test_files_the_supervisor_inherited_stay_out_of_its_workers(supervisors):
    # A worker holding the write end of its starter's pipe would keep that reader waiting
    # for an EOF that never comes.
    def pipes_of(pid: int) -> set[str]:
        links = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                links.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        return links

    read, write = os.pipe()
    try:
        pipe = f"pipe:[{os.fstat(write).st_ino}]"
        sup = supervisors(ECHO).start(pass_fds=(write,))
        assert pipe in pipes_of(sup.proc.pid)  # the supervisor has it, as it was given
        assert pipe not in pipes_of(sup.slots("pdf")[0]["pid"])
    finally:
        os.close(read)
        os.close(write)


def test_a_compiled_core_that_does_not_load_is_said_at_start(supervisors, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.endswith('_c') and name.startswith(('fairsched.core._',\n"
        "                                                    'fairsched.worker._')):\n"
        "            raise ImportError(name + ' is blocked here')\n"
        "sys.meta_path.insert(0, Block())\n")
    sup = supervisors(ECHO)
    sup.env = dict(sup.env, PYTHONPATH=str(tmp_path))
    sup.env.pop("FAIRSCHED_REQUIRE_EXTENSIONS", None)
    sup.start()
    assert sup.ps()["supervisor"]["core"] == "python"
    assert ("the compiled scheduling core did not load (fairsched.core._matching_c is blocked "
            "here); running the pure-Python one") in sup.output(), sup.output()
    # The template's fork helper likewise; its workers start all the same, forked through
    # the pure-Python intermediate.
    assert ("the compiled fork helper (fairsched.worker._orphan_c) did not load; templates "
            "fork their workers through a pure-Python intermediate") in sup.output()
    answer = sup.cli("submit", "pdf", "--on-demand", "--payload", '{"n": 1}')
    assert answer.returncode == 0, answer.stderr


def test_an_on_demand_payload_no_frame_can_carry_is_refused(supervisors):
    sup = supervisors(ECHO).start()
    nan = sup.cli("submit", "pdf", "--on-demand", "--payload", "[NaN]")
    assert nan.returncode == 2, nan.stderr
    assert "--payload is not valid JSON: NaN is not a JSON number" in nan.stderr
    path = sup.config.parent / "state" / "control" / "sock"
    with socket.socket(socket.AF_UNIX) as s:  # a client that sends NaN all the same
        s.connect(str(path))
        s.sendall(b'{"cmd": "submit", "type": "pdf", "payload": [NaN]}\n')
        s.settimeout(10)
        reply = json.loads(s.makefile().readline())
    assert reply["code"] == 2
    assert reply["error"] == "payload: Out of range float values are not JSON compliant"
    with socket.socket(socket.AF_UNIX) as s:  # too large for the command line: a raw client
        s.connect(str(path))
        s.sendall(json.dumps({"cmd": "submit", "type": "pdf", "payload": "x" * (1 << 19)})
                  .encode() + b"\n")
        s.settimeout(10)
        reply = json.loads(s.makefile().readline())
    assert reply["event"] == "refused" and reply["code"] == 2
    assert "bytes of JSON; at most 524288 fit" in reply["error"]
    ok = sup.cli("submit", "pdf", "--on-demand", "--payload", '"fine"')  # and the slot is free
    assert ok.returncode == 0 and json.loads(ok.stdout)["payload"] == "fine"
    assert [s["state"] for s in sup.slots("pdf")] == ["free"]


def test_a_raw_on_demand_caller_may_end_its_request_with_blank_space_but_not_another_request(
        supervisors):
    sup = supervisors(SLOW_PDF).start()
    path = str(sup.config.parent / "state" / "control" / "sock")
    request = b'{"cmd": "submit", "type": "pdf", "payload": {"seconds": 0.5}}'

    def events(sent: bytes) -> list[dict]:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            s.sendall(sent)
            s.settimeout(20)
            return [json.loads(line) for line in s.makefile()]

    # A line ended CRLF, then a blank line (printf '%s\r\n\r\n' | socat ...): the job runs.
    got = events(request + b"\r\n\r\n")
    assert got[-1]["event"] == "result" and got[-1]["result"]["slept"] == 0.5, got
    # A second request on the connection: refused in words, the first one withdrawn.
    got = events(request + b'\n{"cmd": "ps"}\n')
    assert got[-1]["event"] == "refused" and got[-1]["code"] == 2, got
    assert got[-1]["error"].startswith("one request per connection: this one sent more after "
                                       "its request, which was withdrawn"), got
    sup.wait_for(lambda ps: ps["slots"][0]["state"] == "free", what="the slot free again")


def test_an_on_demand_payload_nested_nearly_as_deep_as_json_reads_is_refused_in_one_line(
        supervisors):
    # Past 500 levels, up to where Python's JSON gives up: the command refuses it itself,
    # exit 2, and a client that sends it all the same is refused too, never left with the
    # connection closed unanswered and a traceback in the supervisor's log.
    sup = supervisors(ECHO).start()
    path = sup.config.parent / "state" / "control" / "sock"
    for depth in range(930, 1010, 3):
        nested = "[" * depth + "]" * depth
        result = sup.cli("submit", "pdf", "--on-demand", "--payload", nested)
        assert result.returncode == 2 and result.stdout == "", (depth, result.stderr)
        assert result.stderr in ("fairsched: payload nests deeper than 500 levels\n",
                                 "fairsched: --payload nests too deeply\n"), (depth, result.stderr)
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(path))
            s.sendall(b'{"cmd": "submit", "type": "pdf", "payload": ' + nested.encode() + b"}\n")
            s.settimeout(10)
            reply = json.loads(s.makefile().readline())
        assert reply.get("error") in ("payload nests deeper than 500 levels", "bad request"), (
            depth, reply)
    assert sup.proc.poll() is None and "Traceback" not in sup.output(), sup.output()[-3000:]
    assert [s["state"] for s in sup.slots("pdf")] == ["free"]


def test_an_on_demand_payload_is_sent_and_measured_in_utf8(supervisors):
    sup = supervisors(ECHO.replace("sup_handlers:echo", "sup_handlers:measure")).start()
    path = sup.dir / "emoji.json"
    path.write_text(json.dumps("😀" * 90_000))  # 360 KB of UTF-8, 1.08 MB escaped
    ok = sup.cli("submit", "pdf", "--on-demand", "--payload", f"@{path}")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {"length": 90_000, "characters": ["😀"]}
    path.write_text(json.dumps("é" * 300_000))  # 600,002 bytes: refused before it is sent
    refused = sup.cli("submit", "pdf", "--on-demand", "--payload", f"@{path}")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr == ("fairsched: payload is 600002 bytes of JSON; at most 524288 fit in "
                              "the frame that takes it to a worker (pass a path or a URL "
                              "instead)\n")
    assert "control connection dropped" not in sup.output()


def test_many_concurrent_on_demand_callers(supervisors):
    sup = supervisors(ECHO.replace('name = "pdf"', 'name = "pdf"\nprocesses = 2\nslots = 2')).start()
    callers = [sup.spawn_cli("submit", "pdf", "--on-demand", "--payload", json.dumps({"i": i}))
               for i in range(24)]
    seen = set()
    for caller in callers:
        out, err = caller.communicate(timeout=60)
        assert caller.returncode == 0, err
        seen.add(json.loads(out)["payload"]["i"])
    assert seen == set(range(24))


def test_a_group_with_max_restarts_0_is_fatal_at_its_first_crash(supervisors):
    sup = supervisors(ECHO.replace('handler = "sup_handlers:echo"',
                                   'handler = "sup_handlers:echo"\nmax_restarts = 0'))
    (sup.dir / "crash-at-start").write_text("")
    sup.start(wait=False)
    ps = sup.wait_for(lambda ps: ps["slots"][0]["state"] == "fatal", what="fatal")
    assert ps["slots"][0]["restarts"] == 0
    assert ps["slots"][0]["fatal_reason"].endswith("; crashed once within 60 s"), ps


def test_crash_loop_ends_fatal_and_restart_revives(supervisors):
    sup = supervisors(ECHO.replace('handler = "sup_handlers:echo"',
                                   'handler = "sup_handlers:echo"\nmax_restarts = 2'))
    marker = sup.dir / "crash-at-start"
    marker.write_text("")
    sup.start(wait=False)
    ps = sup.wait_for(lambda ps: ps["slots"][0]["state"] == "fatal", what="fatal")
    assert ps["slots"][0]["restarts"] == 2
    assert "crashed 3 times" in ps["slots"][0]["fatal_reason"]
    human = sup.cli("ps")
    assert "fatal" in human.stdout and "fairsched restart pdf-1" in human.stdout
    marker.unlink()
    restarted = sup.cli("restart", "pdf")
    assert restarted.returncode == 0, restarted.stderr
    sup.wait_for(lambda ps: ps["slots"][0]["state"] == "free", what="revived worker")
    assert sup.cli("submit", "pdf", "--on-demand").returncode == 0


def test_a_caller_that_times_out_learns_what_became_of_its_job(supervisors):
    sup = supervisors(SLOW_PDF).start()
    stubborn = sup.spawn_cli("submit", "pdf", "--on-demand", "--timeout", "1", "--payload",
                             '{"seconds": 2.5, "ignore_cancel": true}')
    sup.wait_for(lambda ps: ps["slots"][0]["state"] == "busy", what="the stubborn job")
    waiting = sup.cli("submit", "pdf", "--on-demand", "--timeout", "0.3")
    assert waiting.returncode == 1
    assert waiting.stderr.strip().endswith("no result within 0.3 s; withdrawn before it started")
    job_id = re.search(r"job (od-\d+)", waiting.stderr).group(1)
    sup.wait_output(rf"job {job_id} withdrawn before it started: its caller gave up \(a timeout, "
                    r"or it left\)")
    _, err = stubborn.communicate(timeout=30)
    assert stubborn.returncode == 1
    assert ("no result within 1 s; its handler on worker pdf-1 was asked to stop (one that does "
            "not check job.cancelled() runs to its end)") in err, err
    sup.wait_for(lambda ps: ps["slots"][0]["state"] == "free", what="the job's end")
    out = sup.output()
    # It ran to its end: a success, not a cancel, in the log and in the counters.
    assert re.search(r"job od-\d+ succeeded after its caller left \(the result is dropped\): "
                     r"type pdf, worker pdf-1", out), out
    counters = sup.ps()["supervisor"]["counters"]
    assert (counters["succeeded"], counters["cancelled"]) == (1, 0), counters


def test_sigterm_honours_shutdown_timeout_and_leaves_no_orphans(supervisors):
    sup = supervisors(SLOW_PDF, shutdown_timeout=1).start()
    pid = sup.slots("pdf")[0]["pid"]
    caller = sup.spawn_cli("submit", "pdf", "--on-demand", "--payload",
                           '{"seconds": 30, "ignore_cancel": true}')
    sup.wait_for(lambda ps: ps["slots"][0]["state"] == "busy", what="the long job")
    began = time.monotonic()
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(20) == 0
    took = time.monotonic() - began
    assert 0.9 <= took < 8, took
    caller.communicate(timeout=10)
    assert caller.returncode == 1
    assert not alive(pid)
    out = sup.output()
    assert re.search(r"worker pdf-1 still runs job od-\d+ at the end of shutdown_timeout \(1 s\); "
                     r"killing it", out), out
    assert ("worker pdf-1 stopped: killed by SIGKILL from the supervisor (still running after "
            "shutdown_timeout, 1 s)") in out, out


def test_shutdown_stops_each_worker_once_its_own_jobs_have_reported(supervisors):
    sup = supervisors(ECHO + SLOW_PDF.replace('"pdf"', '"slow"'), shutdown_timeout=3).start()
    caller = sup.spawn_cli("submit", "slow", "--on-demand", "--payload",
                           '{"seconds": 30, "ignore_cancel": true}')
    sup.wait_for(lambda ps: any(s["state"] == "busy" for s in ps["slots"]), what="slow job")
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(20) == 0
    caller.communicate(timeout=10)
    out = sup.output()
    idle = out.index("worker pdf-1 stopped: exited with code 0")
    assert idle < out.index("worker slow-1 still runs job"), out  # not held by slow-1's job


def test_an_on_demand_job_its_restart_sent_back_is_answered_when_the_supervisor_stops(
        supervisors):
    sup = supervisors(SLOW_PDF).start()
    caller = sup.spawn_cli("submit", "pdf", "--on-demand", "--payload",
                           '{"seconds": 30, "ignore_cancel": true}')
    sup.wait_for(lambda ps: ps["slots"][0]["state"] == "busy", what="the job running")
    assert sup.cli("restart", "pdf").returncode == 0  # its job would run again...
    assert sup.cli("stop").returncode == 0  # ...but the supervisor stops first
    out, err = caller.communicate(timeout=30)
    assert caller.returncode == 1
    assert "the supervisor is shutting down" in err, err
    assert "runs again" not in sup.output(), sup.output()


def test_sigusr_are_logged_and_ignored_and_sighup_reloads(supervisors):
    sup = supervisors(ECHO).start()
    for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        sup.signal(sig)
    wait_until(lambda: sup.output().count("ignoring SIGUSR") >= 2, timeout=10,
               what=lambda: f"two signals said ignored:\n{sup.output()}")
    sup.wait_output(r"reloaded workers\.toml: nothing changed")
    assert "ignoring SIGHUP" not in sup.output()
    assert sup.proc.poll() is None
    assert sup.cli("submit", "pdf", "--on-demand").returncode == 0


def catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler for `sig` (SigCgt in /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as status:
        caught = next(int(line.split()[1], 16) for line in status if line.startswith("SigCgt:"))
    return bool(caught >> (sig - 1) & 1)


@pytest.mark.parametrize("moment", ["at once", "while it connects"])
def test_a_stop_signal_while_the_supervisor_starts_stops_it_cleanly(supervisors, db, moment):
    # At once: before its loop has taken the signals over. While it connects: its check of
    # the schema waits for the migration lock this test holds.
    from fairsched.store.schema import MIGRATION_LOCK

    sup = supervisors(ECHO)
    with psycopg.connect(db) as conn:
        if moment == "while it connects":
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        sup.start(wait=False)
        wait_until(lambda: catches(sup.proc.pid, signal.SIGTERM) or sup.proc.poll() is not None,
                   interval=0.002, what="its SIGTERM handler")  # Python's start comes first
        assert sup.proc.poll() is None, sup.output()
        if moment == "while it connects":
            wait_until(lambda: conn.execute("SELECT count(*) FROM pg_locks WHERE NOT granted"
                                            " AND locktype = 'advisory'").fetchone()[0],
                       what="the supervisor waiting for the migration lock")
        sup.signal(signal.SIGTERM)
    assert sup.wait_exit(timeout=30) == 0, sup.output()
    assert "Traceback" not in sup.output()
    gone = [p for p in psutil.process_iter(["cmdline", "environ"])
            if str(sup.dir) in " ".join(p.info["cmdline"] or [])
            + " ".join((p.info["environ"] or {}).values())
            and p.status() != psutil.STATUS_ZOMBIE]
    assert gone == []


@pytest.mark.parametrize("command", [["stop"], ["ps"]])
def test_a_command_while_the_supervisor_starts_waits_for_its_control_socket(supervisors, db,
                                                                           command):
    """The supervisor holds its lock but listens only once its database is ready: a command
    sent meanwhile waits for it, instead of saying that no supervisor is running (while one
    goes on starting: `stop` would have stopped nothing)."""
    from fairsched.control_client import lock_holder
    from fairsched.store.schema import MIGRATION_LOCK

    sup = supervisors(ECHO)
    with psycopg.connect(db) as conn:  # the migration at its start waits for this lock
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        sup.start(wait=False)
        wait_until(lambda: lock_holder(sup.dir / "state" / "control") == sup.proc.pid,
                   what="the supervisor's lock")
        caller = sup.spawn_cli(*command)
        # Between two tries: it found the lock held and the socket not there, and waits.
        wait_until(lambda: sleeping(caller.pid) or caller.poll() is not None,
                   what="the command waiting for the socket")
        assert caller.poll() is None, caller.communicate()
    out, err = caller.communicate(timeout=30)
    assert caller.returncode == 0, err
    if command == ["stop"]:
        assert out == f"supervisor {sup.proc.pid} stopped\n"
        assert sup.wait_exit(5) == 0


def test_stop_command_cancels_cooperative_jobs_quickly(supervisors):
    sup = supervisors(SLOW_PDF + """\
processes = 2
""").start()
    pids = [s["pid"] for s in sup.slots("pdf")]
    caller = sup.spawn_cli("submit", "pdf", "--on-demand", "--payload", '{"seconds": 30}')
    sup.wait_for(lambda ps: any(s["state"] == "busy" for s in ps["slots"]), what="job")
    began = time.monotonic()
    stopped = sup.cli("stop", timeout=30)
    assert stopped.returncode == 0, stopped.stderr
    assert time.monotonic() - began < 8  # far below the 30 s job: the cancel reached it
    assert sup.wait_exit(5) == 0
    caller.communicate(timeout=10)
    assert all(not alive(p) for p in pids)


def test_stop_timeout_minus_zero_stops_at_once_as_zero_does(supervisors):
    sup = supervisors(SLOW_PDF, shutdown_timeout=60).start()
    caller = sup.spawn_cli("submit", "pdf", "--on-demand", "--payload",
                           '{"seconds": 60, "ignore_cancel": true}')
    sup.wait_for(lambda ps: ps["slots"][0]["state"] == "busy", what="job")
    began = time.monotonic()
    stopped = sup.cli("stop", "--timeout", "-0", timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    assert time.monotonic() - began < 20  # not the 60 s of shutdown_timeout
    assert sup.wait_exit(5) == 0
    caller.communicate(timeout=10)


def misbehaving(supervisors, name: str, mode: str, settings: str = ""):
    """ECHO's pdf worker and a command worker `name` (of type `name`) that misbehaves as
    tests/handlers/garbage_worker.py `mode` says."""
    script = Path(__file__).parent / "handlers" / "garbage_worker.py"
    return supervisors(ECHO + f"""
[[worker]]
name = "{name}"
types = ["{name}"]
command = ["{sys.executable}", "{script}", "{mode}"]
{settings}""")


@pytest.mark.parametrize("mode", ["garbage", "oversized"])
def test_bad_frames_kill_that_worker_only(supervisors, mode):
    sup = misbehaving(supervisors, "liar", mode, "max_attempts = 1").start()
    liar_pid = sup.slots("liar")[0]["pid"]
    result = sup.cli("submit", "liar", "--on-demand", timeout=30)
    assert result.returncode == 1
    assert "bad frame" in result.stderr
    sup.wait_for(lambda ps: next(s for s in ps["slots"] if s["group"] == "liar")["pid"] != liar_pid,
                 what="liar replaced")
    assert not alive(liar_pid)
    assert sup.cli("submit", "pdf", "--on-demand").returncode == 0
    assert sup.proc.poll() is None


def test_ps_tells_why_the_supervisor_killed_a_worker(supervisors):
    sup = misbehaving(supervisors, "liar", "garbage", "max_attempts = 1").start()
    liar_pid = sup.slots("liar")[0]["pid"]
    assert sup.cli("submit", "liar", "--on-demand", timeout=30).returncode == 1
    ps = sup.wait_for(lambda ps: next(s for s in ps["slots"] if s["group"] == "liar")["pid"]
                      not in (None, liar_pid), what="liar replaced")
    liar = next(s for s in ps["slots"] if s["group"] == "liar")
    assert liar["last_exit"].startswith("killed by SIGKILL from the supervisor (it sent a bad "
                                        "frame: "), liar
    assert ("liar-1 last exited: killed by SIGKILL from the supervisor (it sent a bad frame: "
            in sup.cli("ps").stdout)


def test_a_result_for_another_job_than_its_slot_runs_kills_the_worker(supervisors):
    # Left alone, the job would hold its slot for ever: the worker thinks it done.
    sup = misbehaving(supervisors, "odd", "stranger", "max_attempts = 1").start()
    result = sup.cli("submit", "odd", "--on-demand", timeout=30)
    assert result.returncode == 1
    assert re.search(r"sent a bad frame: result for job 'not-od-\d+' on slot 0, which runs job "
                     r"'od-\d+'", result.stderr), result.stderr
    sup.wait_for(lambda ps: next(s for s in ps["slots"] if s["group"] == "odd")["state"]
                 == "free", what="odd back")


def test_a_job_id_sent_back_as_a_string_is_named_as_the_cause(supervisors):
    # Queued jobs have numeric ids; the string "17" for 17 is a worker's usual mistake, and
    # the warning for its progress says so as the error for its result does.
    sup = misbehaving(supervisors, "odd", "texted", "max_attempts = 1").start()
    job_id = int(sup.cli("submit", "odd").stdout)
    hint = "(a job id goes back exactly as it came: a number as a number, a string as a string)"
    sup.wait_output(re.escape(f"worker odd-1 sent progress for job '{job_id}' on slot 0, which "
                              f"runs job {job_id} {hint}; ignored"))
    sup.wait_output(re.escape(f"sent a bad frame: result for job '{job_id}' on slot 0, which "
                              f"runs job {job_id} {hint}"))
    assert "which is not running there" not in sup.output()


def test_a_worker_that_stops_a_job_unasked_and_runs_on_is_stopped(supervisors):
    # Stopping a job unasked is how a worker told to stop by someone else (a SIGTERM) leaves:
    # its slots take no more work. One that then stays holds its place with no work, unless
    # the supervisor stops it.
    sup = misbehaving(supervisors, "picky", "picky", "max_attempts = 1").start()
    pid = sup.slots("picky")[0]["pid"]
    result = sup.cli("submit", "picky", "--on-demand", "--payload", '{"stop": true}', timeout=30)
    assert result.returncode == 1
    assert "stopped it unasked by this supervisor" in result.stderr, result.stderr
    def picky(ps):
        return next(s for s in ps["slots"] if s["group"] == "picky")

    ps = sup.wait_for(lambda ps: picky(ps)["pid"] not in (None, pid), timeout=15,
                      what="picky stopped and started again")
    assert not alive(pid)
    assert "worker picky-1 stopped its jobs as if told to stop, but still runs 2 s after the " \
           "last one; stopping it" in sup.output()
    assert picky(ps)["state"] in ("starting", "free"), picky(ps)
    result = sup.cli("submit", "picky", "--on-demand", "--payload", '{"seconds": 0}', timeout=30)
    assert result.returncode == 0, result.stderr


def test_an_on_demand_result_nested_as_deep_as_a_frame_can_be_read_is_answered(supervisors):
    # A `command` worker may send a result nested deeper than the Python runtime ever does:
    # as deep as the supervisor can read, it must still answer the caller, one way or another.
    sup = misbehaving(supervisors, "deep", "deep", "max_attempts = 1\nmax_restarts = 20").start()

    def submit(depth: int):
        return sup.cli("submit", "deep", "--on-demand", "--payload", json.dumps({"depth": depth}),
                       timeout=30)

    readable, unreadable = 100, 2000  # the deepest read, the shallowest refused as a bad frame
    assert submit(readable).returncode == 0
    assert "bad frame: frame JSON nests too deeply" in submit(unreadable).stderr
    while unreadable - readable > 1:
        depth = (readable + unreadable) // 2
        result = submit(depth)
        if "bad frame" in result.stderr:
            unreadable = depth
            continue
        readable = depth
        assert "closed the connection" not in result.stderr, (depth, result.stderr)
        assert result.returncode == 0 or "its result cannot be sent back" in result.stderr, (
            depth, result.stderr)
    assert "Traceback" not in sup.output(), sup.output()[-3000:]
    assert sup.cli("submit", "pdf", "--on-demand").returncode == 0


def test_progress_fields_of_the_wrong_kind_cost_only_the_progress(supervisors):
    sup = misbehaving(supervisors, "scrawl", "scribble").start()
    result = sup.cli("submit", "scrawl", "--on-demand", timeout=30)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"scribbled": True}
    out = sup.output()
    assert ("worker scrawl-1 sent progress with 'fraction' is 'half', not a number or null and "
            "'message' is 5, not a string; ignored (said once per process)") in out, out
    assert out.count("sent progress with") == 1, out
    assert "Traceback" not in out, out  # a fraction past any double is clamped too


def test_a_fatal_message_is_the_reason_ps_gives(supervisors):
    sup = misbehaving(supervisors, "nolicence", "fatal").start(wait=False)
    ps = sup.wait_for(lambda ps: next(s for s in ps["slots"] if s["group"] == "nolicence")
                      ["state"] == "fatal", what="nolicence fatal", timeout=20)
    row = next(s for s in ps["slots"] if s["group"] == "nolicence")
    assert row["fatal_reason"] == "could not start: no licence file in /etc/render", row
    assert "worker nolicence-1 cannot start: no licence file in /etc/render" in sup.output()


def test_a_frame_cut_short_by_an_exit_is_said(supervisors):
    sup = misbehaving(supervisors, "cutter", "cut", "max_attempts = 1").start()
    result = sup.cli("submit", "cutter", "--on-demand", timeout=30)
    assert result.returncode == 1
    assert ("worker cutter-1 closed its pipe in the middle of a frame (14 bytes of it came)"
            in sup.output()), sup.output()


def test_a_worker_that_closes_its_pipe_but_lives_on_is_killed_and_replaced(supervisors):
    sup = misbehaving(supervisors, "quitter", "hangup", "max_attempts = 1").start()
    pid = sup.slots("quitter")[0]["pid"]
    result = sup.cli("submit", "quitter", "--on-demand", timeout=30)
    assert result.returncode == 1
    # Its job fails when it is killed, saying why, not as soon as its pipe closed.
    assert result.stderr == ("fairsched: job od-1 failed: worker quitter-1 killed by SIGKILL "
                             "from the supervisor (it closed its pipe but kept running)\n")
    row = sup.wait_for(lambda ps: next(s for s in ps["slots"] if s["group"] == "quitter")["pid"]
                       not in (None, pid), what="quitter replaced", timeout=20)
    assert not alive(pid)
    assert next(s for s in row["slots"] if s["group"] == "quitter")["restarts"] == 1
    assert "worker quitter-1 closed its pipe but kept running; killing it" in sup.output()
    assert "worker quitter-1 killed by SIGKILL from the supervisor" in sup.output()


def test_a_worker_that_refuses_all_work_backs_off_and_ends_fatal(supervisors):
    sup = misbehaving(supervisors, "nay", "refuse", "max_restarts = 2").start()
    caller = sup.spawn_cli("submit", "nay", "--on-demand", "--timeout", "60")
    try:
        ps = sup.wait_for(lambda ps: next(s for s in ps["slots"] if s["group"] == "nay")
                          ["process_state"] == "fatal", what="nay fatal", timeout=30)
    finally:
        caller.kill()
        caller.communicate()
    nay = next(s for s in ps["slots"] if s["group"] == "nay")
    assert nay["restarts"] == 2, nay
    out = sup.output()
    assert out.count("worker nay-1 refuses work; restarting it") == 3, out
    # Backing off: the second restart waits. (How it went, SIGTERM or an exit on the stop
    # frame that came first, is a race of no account here.)
    assert re.search(r"worker nay-1 (killed by SIGTERM from the supervisor|exited with code 0) "
                     r"after refusing work; restarting in 0\.1 s", out), out
    assert "crashed 3 times within" in out, out


def test_a_refusal_costs_the_jobs_beside_it_no_attempt(supervisors):
    sup = misbehaving(supervisors, "picky", "picky", "slots = 2\nmax_restarts = 2").start()
    long = int(sup.cli("submit", "picky", "--payload", '{"seconds": 60}').stdout)
    sup.wait_for(lambda ps: any(s["job_id"] == long for s in ps["slots"]), what="the long job")
    refused = int(sup.cli("submit", "picky", "--payload", '{"refuse": true}').stdout)
    # Every new worker takes both again and refuses one: the group ends fatal (a worker out of
    # step with its supervisor), and neither job has paid for it.
    sup.wait_for(lambda ps: next(s for s in ps["slots"] if s["group"] == "picky")
                 ["process_state"] == "fatal", what="picky fatal", timeout=30)
    rows = {row["id"]: row for row in json.loads(sup.cli("jobs", "--json").stdout)}
    out = sup.output()
    for job in (long, refused):
        assert (rows[job]["status"], rows[job]["attempts"]) == ("pending", 0), (rows[job], out)
    assert f"job {long} returned to the queue (restart)" in out, out
    assert "stopped early" not in out, out


@pytest.mark.parametrize("configured, announced", [(3, "2 slots"), (2, "1 slot")])
def test_a_hello_unlike_the_config_is_said_and_the_config_wins(supervisors, configured,
                                                               announced):
    sup = misbehaving(supervisors, "odd", "odd", f"slots = {configured}").start()
    odd = [s for s in sup.slots() if s["group"] == "odd"]
    assert [s["slot"] for s in odd] == list(range(configured - 1)), odd
    assert odd[0]["types"] == ["odd"], odd
    out = sup.output()
    assert (f"worker odd-1 announced {announced}, {configured} configured: it gets "
            f"{configured - 1}\n") in out, out
    assert "worker odd-1 announced types odd, extra; it gets jobs of odd only" in out, out
    assert sup.cli("submit", "odd", "--on-demand").returncode == 0


def test_an_error_without_a_message_says_so(supervisors):
    sup = misbehaving(supervisors, "picky", "picky").start()
    result = sup.cli("submit", "picky", "--on-demand", "--payload", '{"error": " "}')
    assert result.returncode == 1
    assert "worker picky-1 reported an error without a message" in result.stderr, result.stderr


def test_a_worker_in_another_protocol_version_is_fatal_at_once(supervisors):
    sup = misbehaving(supervisors, "new", "future").start(wait=False)
    new = sup.wait_for(lambda ps: any(s["group"] == "new" and s["process_state"] == "fatal"
                                      for s in ps["slots"]), what="new fatal")
    (slot,) = [s for s in new["slots"] if s["group"] == "new"]
    assert slot["restarts"] == 0, slot
    out = sup.output()
    assert ("worker new-1 cannot work with this supervisor: worker speaks protocol 2, the "
            "supervisor speaks 1; killing it") in out, out
    assert "could not start: worker speaks protocol 2, the supervisor speaks 1" in out, out
    assert "this side" not in sup.cli("ps").stdout


def test_a_worker_that_never_says_hello_is_killed_after_start_timeout(supervisors):
    sup = misbehaving(supervisors, "mute", "mute", "start_timeout = 0.5").start(wait=False)
    ps = sup.wait_for(lambda ps: next(s for s in ps["slots"] if s["group"] == "mute")["restarts"]
                      >= 1, what="a restart", timeout=20)
    assert "worker mute-1 did not start within 0.5 s (start_timeout); killing it" in sup.output()
    assert next(s for s in ps["slots"] if s["group"] == "pdf")["state"] == "free"


def test_job_timeouts_restart_the_worker_without_counting_crashes(supervisors):
    # max_restarts = 1: two crashes within the window would make it fatal; timeouts do not.
    sup = supervisors(SLOW_PDF + """\
timeout = 0.3
max_attempts = 1
max_restarts = 1
""").start()
    for _ in range(3):
        result = sup.cli("submit", "pdf", "--on-demand", "--payload", '{"seconds": 30}',
                         timeout=30)
        assert result.returncode == 1 and "timed out after 0.3 s" in result.stderr
        sup.wait_for(lambda ps: ps["slots"][0]["state"] == "free", what="the worker back")
    row = sup.slots("pdf")[0]
    assert row["restarts"] == 3 and row["fatal_reason"] is None
    assert row["last_exit"] == "exited with code 0 after its job timed out", row
    assert sup.output().count("after its job timed out; restarting") == 3


@pytest.mark.parametrize("ignore_cancel", [True, False], ids=["hung", "stops-early"])
def test_job_timeout_stops_the_worker_and_fails_the_attempt(supervisors, ignore_cancel):
    # Hung, the worker is killed under it; cooperative, the handler sees job.cancelled() when
    # the worker is told to stop and returns early: a failed attempt all the same.
    sup = supervisors(SLOW_PDF + """\
timeout = 0.5
max_attempts = 1
""").start()
    pid = sup.slots("pdf")[0]["pid"]
    result = sup.cli("submit", "pdf", "--on-demand", "--payload",
                     json.dumps({"seconds": 30, "ignore_cancel": ignore_cancel}), timeout=30)
    assert result.returncode == 1, result.stdout
    assert "timed out after 0.5 s" in result.stderr
    sup.wait_for(lambda ps: ps["slots"][0]["state"] == "free" and ps["slots"][0]["pid"] != pid,
                 what="replacement")
    # The supervisor's own kill is not taken for the kernel's OOM killer.
    # Hung, it is the job that kept the worker: the worker itself did take the SIGTERM.
    how = ("killed by SIGKILL from the supervisor (job od-1 did not stop within 2 s)"
           if ignore_cancel else "exited with code 0")
    assert f"worker pdf-1 {how}" in sup.output(), sup.output()
    assert ("worker pdf-1 still runs job od-1 2 s after it was told to stop; killing it"
            in sup.output()) == ignore_cancel
    assert "out of memory" not in sup.output() and "OOM" not in sup.output()


def test_standalone_worker_without_fairsched(supervisors):
    script = Path(__file__).parents[1] / "examples" / "standalone_worker.py"
    sup = supervisors(f"""
[[worker]]
name = "plain"
types = ["echo"]
command = ["{sys.executable}", "-S", "{script}"]
""").start()
    result = sup.cli("submit", "echo", "--on-demand", "--payload", '{"x": 1}')
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["echo"] == {"x": 1}


def test_second_supervisor_refused_and_stale_socket_taken_over(supervisors):
    sup = supervisors(ECHO).start()
    second = sup.cli("supervise", "--config", str(sup.config), timeout=30)
    assert second.returncode == 2
    assert "another supervisor" in second.stderr
    as_json = sup.cli("supervise", "--config", str(sup.config), "--log-format", "json")
    assert as_json.returncode == 2
    (line,) = as_json.stderr.splitlines()  # JSON like every other line of that log
    assert json.loads(line)["message"].startswith("another supervisor"), line
    pid = sup.slots("pdf")[0]["pid"]
    sup.proc.kill()  # no cleanup: the socket file stays behind
    sup.proc.wait()
    wait_until(lambda: not alive(pid), timeout=5, what="the orphaned worker exiting by itself")
    sup.start()
    assert sup.cli("submit", "pdf", "--on-demand").returncode == 0


def test_garbage_on_control_socket_closes_only_that_connection(supervisors):
    sup = supervisors(ECHO).start()
    path = sup.config.parent / "state" / "control" / "sock"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    for junk in (b"\xff\xfe garbage\n", b"[1, 2]\n", b"x" * (2 << 20) + b"\n",
                 b"[" * 100_000 + b"\n"):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(path))
            try:
                s.sendall(junk)
                s.settimeout(10)
                while s.recv(65536):
                    pass
            except (BrokenPipeError, ConnectionResetError):
                pass
    assert sup.cli("submit", "pdf", "--on-demand").returncode == 0
    assert "Traceback" not in sup.output()


def control_request(path, request: dict) -> list[dict]:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(path))
        s.settimeout(10)
        s.sendall(json.dumps(request).encode() + b"\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return [json.loads(line) for line in data.splitlines()]


def test_bad_fields_on_the_control_socket_are_refused(supervisors):
    sup = supervisors(ECHO).start()
    path = sup.config.parent / "state" / "control" / "sock"
    for request, error in [
        ({"cmd": "submit", "type": "pdf", "timeout": "abc"}, "timeout must be a number of seconds"),
        ({"cmd": "submit", "type": "pdf", "timeout": [1]}, "timeout must be a number of seconds"),
        ({"cmd": "submit", "type": "pdf", "timeout": -5}, "timeout must be a number of seconds"),
        ({"cmd": "submit", "type": "pdf", "payload": json.loads("[" * 501 + "]" * 501)},
         "payload nests deeper than 500 levels"),
        ({"cmd": "stop", "timeout": "soon"}, "timeout must be a number of seconds >= 0"),
        # An integer too large for a float: a number of seconds no clock can count.
        ({"cmd": "submit", "type": "pdf", "timeout": 10 ** 400},
         "timeout must be a number of seconds"),
        ({"cmd": "stop", "timeout": 10 ** 400}, "timeout must be a number of seconds >= 0"),
    ]:
        (reply,) = control_request(path, request)
        assert error in reply["error"] and reply["code"] == 2, reply
    assert sup.proc.poll() is None and "Traceback" not in sup.output()
    assert sup.slots()[0]["state"] == "free"  # nothing was started for nobody


def _room_for(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < n + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 1024), hard))


def test_waiting_on_demand_callers_leave_room_for_the_operator(supervisors):
    _room_for(300)
    sup = supervisors(SLOW_PDF).start()
    path = sup.config.parent / "state" / "control" / "sock"
    callers = []
    try:
        for _ in range(256):
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(path))
            s.settimeout(10)
            s.sendall(b'{"cmd": "submit", "type": "pdf", "payload": {"seconds": 30}}\n')
            callers.append(s)
        for s in callers:
            assert b'"accepted"' in s.recv(4096)
        refused = sup.cli("submit", "pdf", "--on-demand")
        assert refused.returncode == 1
        assert "256 on-demand requests are waiting already; try again" in refused.stderr
        ps = sup.cli("ps", "--json")  # the operator still gets in
        assert ps.returncode == 0
        assert json.loads(ps.stdout)["supervisor"]["waiting_on_demand"] == 255
    finally:
        for s in callers:
            s.close()


def test_ps_and_stop_wait_their_turn_behind_a_full_backlog_of_callers(supervisors):
    """A burst of callers the supervisor has not accepted yet filled its listen backlog:
    `ps` and `stop` said 'Resource temporarily unavailable' and gave up."""
    _room_for(300)
    sup = supervisors(ECHO).start()
    path = sup.config.parent / "state" / "control" / "sock"
    queued = []
    sup.signal(signal.SIGSTOP)  # busy: it accepts nothing for a while
    try:
        while True:
            s = socket.socket(socket.AF_UNIX)
            s.setblocking(False)
            try:
                s.connect(str(path))
            except BlockingIOError:  # the backlog is full
                s.close()
                break
            queued.append(s)
        ps = sup.spawn_cli("ps", "--json")
        # Between two tries: it found the backlog full, and waits its turn.
        wait_until(lambda: sleeping(ps.pid) or ps.poll() is not None,
                   what="ps waiting for room in the backlog")
        assert ps.poll() is None, ps.communicate()
        sup.signal(signal.SIGCONT)
        for s in queued:  # the burst's callers leave without a request
            s.close()
        out, err = ps.communicate(timeout=60)
        assert (ps.returncode, err) == (0, ""), err
        assert json.loads(out)["slots"][0]["state"] == "free"
    finally:
        sup.signal(signal.SIGCONT)
        for s in queued:
            s.close()
    stop = sup.cli("stop")
    assert stop.returncode == 0, stop.stderr


def test_an_on_demand_job_that_finishes_through_a_restart_keeps_its_result(supervisors):
    sup = supervisors(SLOW_PDF).start()
    pid = sup.slots("pdf")[0]["pid"]
    caller = sup.spawn_cli("submit", "pdf", "--on-demand", "--payload",
                           '{"seconds": 1, "ignore_cancel": true}')
    sup.wait_for(lambda ps: ps["slots"][0]["state"] == "busy", what="the job running")
    assert sup.cli("restart", "pdf").returncode == 0  # the worker finishes the job, then exits
    out, err = caller.communicate(timeout=30)
    assert caller.returncode == 0, err
    assert json.loads(out)["pid"] == pid  # the first run's result, not a second run's
    assert sup.output().count("started: type pdf") == 1


def test_an_on_demand_job_its_restart_stops_runs_again_on_the_new_worker(supervisors):
    sup = supervisors(SLOW_PDF).start()
    pid = sup.slots("pdf")[0]["pid"]
    caller = sup.spawn_cli("submit", "pdf", "--on-demand", "--payload", '{"seconds": 1}')
    busy = sup.wait_for(lambda ps: ps["slots"][0]["state"] == "busy", what="the job running")
    job_id = busy["slots"][0]["job_id"]
    assert sup.cli("restart", "pdf").returncode == 0  # the job stops early: not its fault
    out, err = caller.communicate(timeout=30)
    assert caller.returncode == 0, err
    result = json.loads(out)
    assert result["pid"] != pid and result["attempt"] == 1
    assert f"job {job_id} runs again (its worker restarted)" in sup.output()


def test_restart_a_running_worker_by_name(supervisors):
    sup = supervisors(ECHO.replace('name = "pdf"', 'name = "pdf"\nprocesses = 2')).start()
    before = {s["worker"]: s["pid"] for s in sup.slots()}
    result = sup.cli("restart", "pdf-2")
    assert result.returncode == 0 and "pdf-2" in result.stdout
    ps = sup.wait_for(lambda ps: all(s["state"] == "free" for s in ps["slots"])
                      and ps["slots"][1]["pid"] != before["pdf-2"], what="pdf-2 restarted")
    assert ps["slots"][0]["pid"] == before["pdf-1"]
    assert ps["slots"][1]["last_exit"] == "exited with code 0 (restarted by the operator)"
    assert ps["slots"][0]["last_exit"] is None
    assert sup.cli("restart", "nope").returncode == 2


def test_workers_and_templates_name_themselves_in_the_process_list(supervisors):
    sup = supervisors(ECHO.replace('name = "pdf"', 'name = "pdf"\nprocesses = 2')).start()
    titles = {" ".join(psutil.Process(s["pid"]).cmdline()).strip() for s in sup.slots()}
    assert titles == {f"fairsched: worker pdf-{n} (sup_handlers:echo, supervisor {sup.proc.pid})"
                      for n in (1, 2)}
    children = [" ".join(p.cmdline()).strip() for p in psutil.Process(sup.proc.pid).children()]
    assert f"fairsched: template pdf (sup_handlers:echo, supervisor {sup.proc.pid})" in children


def test_restart_runs_the_handler_as_it_is_now(supervisors):
    # Workers fork from a template that imported the handler: a restart imports it afresh.
    sup = supervisors("""
[[worker]]
name = "doc"
types = ["doc"]
handler = "versioned:handle"
processes = 2
""")
    handler = sup.dir / "versioned.py"
    handler.write_text("def handle(job):\n    return 'first'\n")
    sup.start()
    assert json.loads(sup.cli("submit", "doc", "--on-demand").stdout) == "first"
    handler.write_text("def handle(job):\n    return 'the second version'\n")
    before = {s["pid"] for s in sup.slots()}
    assert sup.cli("restart", "doc").returncode == 0
    sup.wait_for(lambda ps: all(s["state"] == "free" and s["pid"] not in before
                                for s in ps["slots"]), what="doc restarted")
    for _ in range(4):  # both processes
        assert json.loads(sup.cli("submit", "doc", "--on-demand").stdout) == "the second version"


DOC_WORKER = """
[[worker]]
name = "doc"
types = ["doc"]
handler = "versioned:handle"
processes = 2
"""


def test_restart_while_the_template_imports_still_gets_the_newest_code(supervisors):
    sup = supervisors(DOC_WORKER)
    handler = sup.dir / "versioned.py"
    imports = sup.dir / "imports"  # the pid of each process that began to import it
    slow = ("import os, pathlib, time\n"
            "pathlib.Path(__file__).with_name('imports').open('a').write(f'{os.getpid()}\\n')\n"
            "time.sleep(2)\n\ndef handle(job):\n    return VALUE\n")
    handler.write_text(slow.replace("VALUE", "1"))
    sup.start()
    first = set(imports.read_text().split())
    assert sup.cli("restart", "doc").returncode == 0  # its template imports for 2 s ...
    wait_until(lambda: set(imports.read_text().split()) - first,
               what="the new template importing the first version")
    handler.write_text(slow.replace("VALUE", "'two'"))
    assert sup.cli("restart", "doc").returncode == 0  # ... and starts over with this
    sup.wait_for(lambda ps: all(s["state"] == "free" for s in ps["slots"]), what="doc back",
                 timeout=30)
    for _ in range(4):
        assert json.loads(sup.cli("submit", "doc", "--on-demand").stdout) == "two"


def test_a_template_that_fails_leaves_nothing_deaf_behind(supervisors):
    # The handler imports in a worker, not in its template: the template fails at once, the
    # workers start cold. Round after round the supervisor hears every worker, and ps.
    sup = supervisors(DOC_WORKER)
    (sup.dir / "versioned.py").write_text(
        "import os\nif 'FAIRSCHED_WORKER' not in os.environ:\n"
        "    raise ImportError('only in a worker')\n\ndef handle(job):\n    return os.getpid()\n")
    sup.start()
    for _ in range(3):
        before = {s["pid"] for s in sup.slots()}
        assert sup.cli("restart", "doc").returncode == 0
        sup.wait_for(lambda ps, before=before: all(s["state"] == "free" and s["pid"] not in before
                                                   for s in ps["slots"]), what="doc back",
                     timeout=15)
        assert sup.cli("submit", "doc", "--on-demand", "--timeout", "10").returncode == 0


def test_a_stuck_template_is_replaced_by_cold_starts(supervisors):
    sup = supervisors(ECHO.replace('name = "pdf"', 'name = "pdf"\nstart_timeout = 2')).start()
    (template,) = [p for p in psutil.Process(sup.proc.pid).children()
                   if "template pdf" in " ".join(p.cmdline())]
    template.suspend()
    try:
        (old,) = [s["pid"] for s in sup.slots()]
        os.kill(old, signal.SIGKILL)  # its replacement is asked of the stopped template
        sup.wait_for(lambda ps: ps["slots"][0]["state"] == "free"
                     and ps["slots"][0]["pid"] not in (None, old), what="pdf-1 back", timeout=20)
    finally:
        with contextlib.suppress(psutil.Error):
            template.resume()
    assert ("template for pdf did not start worker pdf-1 within 2 s (start_timeout); killing "
            "it, its workers start cold") in sup.output()
    assert not alive(template.pid)
    assert sup.cli("submit", "pdf", "--on-demand").returncode == 0


def test_a_worker_its_template_forks_during_the_shutdown_is_stopped_at_once(supervisors):
    # The template answers with the new worker's pid only once the shutdown has begun: the
    # worker is stopped then, not left to find out from its pipe that the supervisor is gone.
    sup = supervisors(ECHO + SLOW_PDF.replace('"pdf"', '"slow"'), shutdown_timeout=4).start()
    caller = sup.spawn_cli("submit", "slow", "--on-demand", "--payload",
                           '{"seconds": 30, "ignore_cancel": true}')
    sup.wait_for(lambda ps: any(s["state"] == "busy" for s in ps["slots"]), what="slow job")
    (template,) = [p for p in psutil.Process(sup.proc.pid).children()
                   if "template pdf" in " ".join(p.cmdline())]
    template.suspend()
    try:
        (old,) = [s["pid"] for s in sup.slots("pdf")]
        os.kill(old, signal.SIGKILL)  # its replacement is asked of the stopped template
        sup.wait_for(lambda ps: [s["pid"] for s in ps["slots"] if s["worker"] == "pdf-1"]
                     == [None], what="pdf-1 being forked")
        began = time.monotonic()
        sup.signal(signal.SIGTERM)  # the slow job holds the shutdown for up to 4 s
        sup.wait_output(r"shutting down: cancelling 1 running job")
    finally:
        template.resume()
    assert sup.wait_exit(20) == 0
    caller.communicate(timeout=10)
    out = sup.output()
    spawned = re.findall(r"worker pdf-1 spawned \(pid (\d+)\)", out)
    assert len(spawned) == 2, out  # the first, and the one forked during the shutdown
    new = int(spawned[1])
    stopped = [line for line in out.splitlines() if "worker pdf-1 stopped" in line]
    assert len(stopped) == 1 and "SIGKILL" not in stopped[0], out
    assert out.index(f"spawned (pid {new})") < out.index(stopped[0])
    assert out.index(stopped[0]) < out.index("worker slow-1 still runs job"), out
    assert not alive(new) and time.monotonic() - began < 10


def test_what_a_handlers_import_started_in_its_template_goes_with_the_supervisor(supervisors):
    sup = supervisors('[[worker]]\nname = "sp"\ntypes = ["sp"]\nhandler = "spawner:run"\n')
    (sup.dir / "spawner.py").write_text(textwrap.dedent("""
        import pathlib, subprocess
        HELPER = subprocess.Popen(["sleep", "600"])  # a helper the module starts at import
        pathlib.Path(__file__).with_name("helpers").open("a").write(f"{HELPER.pid}\\n")

        def run(job):
            return None
    """))
    sup.start()
    assert sup.cli("submit", "sp", "--on-demand").returncode == 0
    helpers = [int(pid) for pid in (sup.dir / "helpers").read_text().split()]
    assert helpers and all(alive(pid) for pid in helpers)  # the template's, and maybe a cold one's
    assert sup.cli("stop").returncode == 0
    assert sup.wait_exit() == 0
    wait_until(lambda: not [pid for pid in helpers if alive(pid)], timeout=5,
               what=lambda: f"the helpers gone: {[pid for pid in helpers if alive(pid)]} live")


def templates_of(sup, group: str) -> list[psutil.Process]:
    """The group's templates: titled once they have imported, still importing otherwise."""
    found = []
    for child in psutil.Process(sup.proc.pid).children():
        with contextlib.suppress(psutil.Error):
            cmdline = child.cmdline()
            if (f"template {group} " in " ".join(cmdline)
                    or ("--template" in cmdline and child.environ().get("FAIRSCHED_GROUP") == group)):
                found.append(child)
    return found


def test_a_template_killed_while_importing_is_replaced_too(supervisors):
    sup = supervisors("""
[[worker]]
name = "heavy"
types = ["heavy"]
handler = "heavy:handle"
""")
    imports = sup.dir / "imports"  # the pid of each process that began to import it
    (sup.dir / "heavy.py").write_text(
        "import os, pathlib, time\n"
        "pathlib.Path(__file__).with_name('imports').open('a').write(f'{os.getpid()}\\n')\n"
        "time.sleep(2)  # a model to load\n\ndef handle(job):\n    return 1\n")
    sup.start()
    seen = set()
    for _ in range(2):  # ready, then importing: either way a new one follows
        (template,) = wait_until(
            lambda: [t for t in templates_of(sup, "heavy") if t.pid not in seen],
            what="a new template")
        seen.add(template.pid)
        wait_until(lambda pid=template.pid: str(pid) in imports.read_text().split(),
                   what="the template importing")
        template.kill()
    sup.wait_output(r"template for heavy exited while starting \(see .*\); its workers start "
                    r"cold until a new one has imported heavy:handle \(in 2 s\)")
    wait_until(lambda: [t for t in templates_of(sup, "heavy") if t.pid not in seen],
               what="a third template")
    assert sup.cli("submit", "heavy", "--on-demand", timeout=30).returncode == 0


def test_restart_is_refused_while_the_supervisor_stops(supervisors):
    sup = supervisors(SLOW_PDF, shutdown_timeout=10).start()
    caller = sup.spawn_cli("submit", "pdf", "--on-demand", "--payload",
                           '{"seconds": 3, "ignore_cancel": true}')
    sup.wait_for(lambda ps: ps["slots"][0]["state"] == "busy", what="busy")
    stopper = sup.spawn_cli("stop")
    sup.wait_for(lambda ps: ps["supervisor"]["shutting_down"], what="shutting down")
    assert "SHUTTING DOWN" in sup.cli("ps").stdout.splitlines()[0]
    assert "shutting down: cancelling 1 running job, waiting up to 10 s" in sup.output()
    result = sup.cli("restart", "pdf")
    assert result.returncode == 1
    assert "the supervisor is shutting down: nothing restarts" in result.stderr
    caller.communicate(timeout=30)
    assert caller.returncode == 0  # its grace was not cut short
    stopper.communicate(timeout=30)
    assert stopper.returncode == 0


def test_ps_human_table_and_progress(supervisors):
    sup = supervisors(SLOW_PDF).start()
    caller = sup.spawn_cli("submit", "pdf", "--on-demand", "--payload", '{"seconds": 2}')
    sup.wait_for(lambda ps: ps["slots"][0]["message"] == "started", what="progress")
    table = sup.cli("ps").stdout.splitlines()
    assert table[0].startswith("supervisor pid") and "core " in table[0]
    assert table[1].split() == ["WORKER", "PID", "SLOT", "TYPES", "STATE", "JOB", "AGE", "PROGRESS",
                                "RESTARTS", "UPTIME", "RSS", "CPU"]
    assert "busy" in table[2] and "od-1" in table[2]
    caller.communicate(timeout=30)
    assert caller.returncode == 0
    # Which fairsched runs: in ps --json and in the line the supervisor started with.
    version = sup.cli("--version").stdout.split()[-1]
    assert sup.ps()["supervisor"]["version"] == version
    assert re.search(rf"supervisor \d+ started \(pid \d+, fairsched {re.escape(version)}, core c",
                     sup.output()), sup.output()


def test_ps_shows_a_cancel_waiting_for_its_answer(supervisors):
    sup = supervisors(SLOW_PDF).start()
    caller = sup.spawn_cli("submit", "pdf", "--on-demand", "--timeout", "1",
                           "--payload", '{"seconds": 4, "ignore_cancel": true}')
    ps = sup.wait_for(lambda ps: ps["slots"][0]["cancelling"] == "caller", what="cancelling")
    assert ps["slots"][0]["state"] == "busy"
    (row,) = [line for line in sup.cli("ps").stdout.splitlines() if line.startswith("pdf-1")]
    assert "busy   od-1" in row and "cancelling; 0% started" in row, row
    caller.communicate(timeout=10)
    assert caller.returncode == 1


def test_ps_watch_redraws_until_interrupted(supervisors):
    sup = supervisors(ECHO).start()
    watcher = sup.spawn_cli("ps", "--watch")
    seen = read_until(watcher, lambda out: out.count(b"\npdf-1 ") >= 2, what="two tables")
    watcher.send_signal(signal.SIGINT)
    out, err = watcher.communicate(timeout=10)
    out = seen.decode() + out
    assert watcher.returncode == 0, err
    assert "Traceback" not in err
    # Not a terminal here, so no screen clearing: one table after another.
    assert out.count("WORKER") >= 2 and out.count("pdf-1") >= 2


SLOW_IMPORT = """
import os
import time

time.sleep(5)  # a handler with heavy imports
IMPORTED_IN = os.getpid()


def handle(job):
    return {"pid": os.getpid(), "imported_in": IMPORTED_IN}
"""


def test_a_slow_handler_import_holds_up_only_its_own_workers(supervisors):
    sup = supervisors(ECHO + """
[[worker]]
name = "heavy"
types = ["heavy"]
handler = "slow_import:handle"
processes = 2
""")
    (sup.dir / "slow_import.py").write_text(SLOW_IMPORT)
    sup.start(wait=False)
    # The supervisor answers and the pdf worker serves while the heavy template imports
    # (were the supervisor waiting for the import, the heavy workers would be up by then).
    early = sup.wait_for(lambda ps: [s["state"] for s in ps["slots"] if s["group"] == "pdf"]
                         == ["free"], timeout=20, what="the pdf worker ready")
    heavy = [(s["state"], s["pid"]) for s in early["slots"] if s["group"] == "heavy"]
    assert heavy == [("starting", None), ("starting", None)]
    assert sup.cli("submit", "pdf", "--on-demand").returncode == 0
    ready = sup.wait_for(lambda ps: all(s["state"] == "free" for s in ps["slots"]),
                         timeout=30, what="every worker ready")
    # Both heavy workers were forked from the template: neither imported the handler itself.
    pids = {s["pid"] for s in ready["slots"] if s["group"] == "heavy"}
    results = [json.loads(sup.cli("submit", "heavy", "--on-demand").stdout) for _ in range(4)]
    assert {r["pid"] for r in results} <= pids
    assert all(r["imported_in"] not in pids for r in results)


def test_restart_while_the_template_imports_counts_no_restart(supervisors):
    # Its workers have not started yet: a restart imports the code afresh, and they start
    # once (not restarted, not counted) when that import is done.
    sup = supervisors(ECHO.replace("sup_handlers:echo", "slow_import:handle"))
    (sup.dir / "slow_import.py").write_text(SLOW_IMPORT.replace("time.sleep(5)", "time.sleep(2)"))
    sup.start(wait=False)
    sup.wait_for(lambda ps: [s["state"] for s in ps["slots"]] == ["starting"], what="importing")
    for _ in range(2):
        assert sup.cli("restart", "pdf").returncode == 0
    ps = sup.wait_for(lambda ps: [s["state"] for s in ps["slots"]] == ["free"], timeout=30,
                      what="the worker ready")
    assert ps["slots"][0]["restarts"] == 0 and ps["supervisor"]["counters"]["restarts"] == 0
    assert "restarted by the operator" not in sup.output()
    assert sup.output().count("worker pdf-1 spawned") == 1


def test_stop_while_a_template_is_still_importing(supervisors):
    sup = supervisors(ECHO.replace("sup_handlers:echo", "slow_import:handle"))
    (sup.dir / "slow_import.py").write_text(SLOW_IMPORT)

    def templates() -> list:
        return [p for p in psutil.process_iter(["cmdline"])
                if "--template" in (p.info["cmdline"] or []) and str(sup.dir) in p.info["cmdline"]]

    sup.start(wait=False)
    sup.wait_for(lambda ps: [s["state"] for s in ps["slots"]] == ["starting"], what="importing")
    assert templates()
    assert sup.cli("stop").returncode == 0
    assert sup.wait_exit(timeout=15) == 0
    out = sup.output()
    assert "supervisor stopped" in out
    assert "Traceback" not in out and "Task was destroyed" not in out, out
    # The template goes too, mid-import: it dies with its supervisor.
    wait_until(lambda: not templates(), timeout=10, what="the template gone")


def test_a_template_stuck_importing_is_killed_after_start_timeout(supervisors):
    sup = supervisors(ECHO + """
[[worker]]
name = "stuck"
types = ["stuck"]
handler = "slow_import:handle"
start_timeout = 1
""")
    (sup.dir / "slow_import.py").write_text(SLOW_IMPORT.replace("time.sleep(5)", "time.sleep(600)"))
    sup.start(wait=False)
    ps = sup.wait_for(lambda ps: next(s for s in ps["slots"] if s["group"] == "stuck")["restarts"]
                      >= 1, what="the cold worker killed and restarted", timeout=30)
    out = sup.output()
    assert ("template for stuck did not import slow_import:handle within 1 s (start_timeout);"
            " killing it, its workers start cold") in out, out
    assert "worker stuck-1 did not start within 1 s (start_timeout); killing it" in out, out
    assert next(s for s in ps["slots"] if s["group"] == "pdf")["state"] == "free"

    def group(p: psutil.Process) -> str | None:
        try:
            return p.environ().get("FAIRSCHED_GROUP")
        except psutil.Error:
            return None

    stuck = [p for p in psutil.process_iter(["cmdline"])
             if "--template" in (p.info["cmdline"] or []) and str(sup.dir) in p.info["cmdline"]
             and group(p) == "stuck"]
    assert not stuck


def test_ps_and_stop_still_reach_a_supervisor_whose_config_broke_since(supervisors):
    sup = supervisors(ECHO).start()
    sup.config.write_text(sup.config.read_text() + "\n[[worker]]\nname = \"typo\"\n")
    assert sup.cli("jobs").returncode == 2  # commands that need the workers still refuse it
    ps = sup.cli("ps", "--json")
    assert ps.returncode == 0, ps.stderr
    assert [s["state"] for s in json.loads(ps.stdout)["slots"]] == ["free"]
    stopped = sup.cli("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert sup.wait_exit(10) == 0


def test_an_on_demand_caller_that_stops_reading_costs_the_supervisor_no_memory(supervisors):
    # A caller suspended (Ctrl-Z) while its job reports progress: the supervisor holds only
    # the latest progress for it, and sends it and the result once the caller reads again.
    sup = supervisors("""
[[worker]]
name = "chatty"
types = ["chatty"]
handler = "sup_handlers:chatty"
""").start()
    supervisor = psutil.Process(sup.proc.pid)
    before = supervisor.memory_info().rss
    n = 150_000  # about 20 MB of progress events
    caller = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    caller.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    caller.connect(str(sup.dir / "state" / "control" / "sock"))
    caller.sendall(json.dumps({"cmd": "submit", "type": "chatty", "payload": {"n": n}}).encode()
                   + b"\n")
    sup.wait_for(lambda ps: ps["supervisor"]["counters"].get("succeeded", 0) == 1,
                 timeout=120, what="the job done")
    grown = supervisor.memory_info().rss - before
    events = [json.loads(line) for line in caller.makefile("rb")]
    caller.close()
    assert events[-1] == {"event": "result", "job_id": events[0]["job_id"],
                          "result": {"steps": n}}, events[-1]
    progress = [e for e in events if e["event"] == "progress"]
    assert 0 < len(progress) < n // 2
    assert grown < 8 << 20, f"the supervisor grew by {grown >> 20} MiB"


def test_ps_watch_into_a_pipe_its_reader_closed_ends_quietly(supervisors):
    sup = supervisors(ECHO).start()
    watch = subprocess.Popen([sys.executable, "-m", "fairsched", "ps", "--watch"], env=sup.env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    watch.stdout.readline()  # it draws; then its reader goes, as `| head -1` does
    watch.stdout.close()
    assert watch.wait(30) == 1
    assert watch.stderr.read() == b""  # no word of a control socket lost: the supervisor is fine
    watch.stderr.close()
    assert sup.cli("ps").returncode == 0


def test_stop_ps_and_a_timed_caller_give_up_on_a_supervisor_that_does_not_answer(supervisors):
    sup = supervisors(ECHO).start()
    sup.proc.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        ps = sup.spawn_cli("ps")
        caller = sup.spawn_cli("submit", "pdf", "--on-demand", "--timeout", "1")
        result = sup.cli("stop", timeout=90)
        waited = time.monotonic() - started
        ps_out, ps_err = ps.communicate(timeout=60)
        # Its timeout ran out long ago, and no word of it came: it does not wait for ever.
        caller_out, caller_err = caller.communicate(timeout=60)
    finally:
        sup.proc.send_signal(signal.SIGCONT)
    said = (f"the supervisor (pid {sup.proc.pid}) did not answer within 30 s: stalled, or "
            f"stopped with SIGSTOP (`kill -CONT {sup.proc.pid}` wakes it)\n")
    assert result.returncode == 1 and result.stderr == f"fairsched: {said}", result.stderr
    assert ps.returncode == 1 and ps_err == f"fairsched: {said}", ps_err
    assert caller.returncode == 1 and caller_out == "", caller_err
    assert caller_err == f"fairsched: {said.replace('within 30 s', 'within 31 s')}", caller_err
    assert waited < 60
    assert sup.cli("stop").returncode == 0  # awake again, it stops as asked
    assert sup.proc.wait(30) == 0


def test_a_handler_folder_may_hold_what_the_worker_itself_imports(supervisors):
    # A json.py beside workers.toml is the handler's business: the worker's own `import
    # json` is done before that folder goes first on sys.path.
    sup = supervisors(ECHO)
    (sup.dir / "json.py").write_text("raise ImportError('not the standard library json')\n")
    sup.start()
    result = sup.cli("submit", "pdf", "--on-demand", "--payload", '{"n": 1}')
    assert result.returncode == 0, result.stderr + sup.output()[-2000:]


def test_a_handler_that_starts_threads_at_import_runs_in_cold_workers(supervisors):
    sup = supervisors("""
[[worker]]
name = "threaded"
types = ["threaded"]
handler = "thread_on_import:handle"
processes = 2
""")
    shutil.copy(Path(__file__).parent / "handlers" / "thread_on_import.py", sup.dir)
    sup.start()
    for _ in range(4):
        result = sup.cli("submit", "threaded", "--on-demand", timeout=30)
        assert result.returncode == 0, result.stderr
    assert re.search(r"WARNING +fairsched.supervisor: template for threaded: importing "
                     r"thread_on_import:handle started 1 thread\(s\)", sup.output()), sup.output()


def test_a_handler_that_imports_in_its_workers_but_not_in_its_template_is_said_once(
        supervisors):
    # FAIRSCHED_WORKER is set per worker, not in the template: an import that reads it fails
    # there and works in workers started cold, which the operator learns from one warning.
    sup = supervisors("""
[[worker]]
name = "named"
types = ["named"]
handler = "named_at_import:handle"
processes = 2
""")
    (sup.dir / "named_at_import.py").write_text(
        "import os\nNAME = os.environ['FAIRSCHED_WORKER']\n\n"
        "def handle(job):\n    return [NAME, os.getpid()]\n")
    sup.start()
    for _ in range(4):
        result = sup.cli("submit", "named", "--on-demand", timeout=30)
        assert result.returncode == 0, result.stderr
        name, pid = json.loads(result.stdout)
        assert {"worker": name, "pid": pid} in [{"worker": s["worker"], "pid": s["pid"]}
                                                for s in sup.slots()]
    warnings = re.findall(r"WARNING +fairsched.supervisor: (.*)", sup.output())
    assert warnings == [
        "template for named could not start: cannot import handler 'named_at_import:handle': "
        "KeyError: 'FAIRSCHED_WORKER'; its workers import it all the same (reading at import a "
        "variable set per worker, such as FAIRSCHED_WORKER?), so they start cold, each "
        "importing it"], sup.output()

def test_ps_shows_any_progress_message_on_its_own_row(supervisors):
    # Text from a handler (a file name with a broken surrogate, a line break, an escape
    # sequence) must neither break the table nor the terminal.
    sup = supervisors("""
[[worker]]
name = "says"
types = ["says"]
handler = "sup_handlers:says"
""").start()
    caller = sup.spawn_cli("submit", "says", "--on-demand", "--payload",
                           json.dumps({"message": "\ud800x\nWORKER FAKE\x1b[2J"}))
    sup.wait_for(lambda ps: ps["slots"][0]["message"], what="the message")
    result = sup.cli("ps")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3, lines  # the supervisor, the header, the one slot
    assert "50% \\ud800x\\nWORKER FAKE\\x1b[2" in lines[2], lines[2]  # cut at 30
    caller.kill()
    # The waiting caller's progress line on a terminal is as safe: one line, redrawn.
    import pty

    master, slave = pty.openpty()
    watcher = subprocess.Popen(
        [sys.executable, "-m", "fairsched", "submit", "says", "--on-demand", "--payload",
         json.dumps({"message": "x\nWORKER FAKE\x1b[2J\x07"})],
        env=dict(sup.env, TERM="xterm"), stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 20
    try:
        while b"FAKE" not in seen and time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                seen += os.read(master, 4096)
    finally:
        watcher.kill()
        watcher.wait()
        os.close(master)
    assert b"50.0% x\\nWORKER FAKE\\x1b[2J\\x07" in seen, seen
    assert b"\x07" not in seen and b"\x1b[2J" not in seen, seen


def test_a_worker_that_dies_before_its_hello_is_shown_with_its_last_words(supervisors):
    sup = misbehaving(supervisors, "early", "early", "max_restarts = 1").start()
    ps = sup.wait_for(lambda ps: next(s for s in ps["slots"] if s["group"] == "early")["state"]
                      == "fatal", what="early fatal")
    early = next(s for s in ps["slots"] if s["group"] == "early")
    assert early["fatal_reason"] == ("exited with code 1 before its hello (its log ends: licence "
                                     "server unreachable); crashed 2 times within 60 s"), early


def test_a_retried_on_demand_job_waits_from_its_retry(supervisors):
    # As a queued job's retry does: its first run is not counted as waiting (nor scored so).
    sup = supervisors("""
[[worker]]
name = "flaky"
types = ["flaky"]
handler = "sup_handlers:flaky_once"
""").start()
    result = sup.cli("submit", "flaky", "--on-demand", "--payload", '{"seconds": 1.5}')
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"attempt": 2}
    waited = re.search(r"job od-1 started: type flaky, worker flaky-1, slot 0, attempt 2/3, "
                       r"waited (\d+\.\d+) s", sup.output())
    assert waited and float(waited.group(1)) < 0.5, sup.output()


def test_a_caller_that_hangs_up_is_no_warning_and_a_bad_request_is_one(supervisors):
    sup = supervisors(ECHO).start()
    path = str(sup.dir / "state" / "control" / "sock")
    for _ in range(20):  # ask, and leave before the answer
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.sendall(b'{"cmd": "ps"}\n')
        s.close()
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(b"x" * (2 << 20))  # no line end within the 1 MiB a request may have
    sup.wait_output("control socket: cut or turned away 1 connection in 5 s: 1 sent a "
                    "request longer than 1 MiB", timeout=10)
    assert sup.output().count("control socket") == 1, sup.output()[-3000:]
    assert sup.cli("ps").returncode == 0


def test_a_job_that_crashes_every_worker_spends_its_attempts_not_the_groups_restarts(
        supervisors):
    # Two requests whose input kills the worker (3 attempts each): 6 crashes, but only the
    # first of each job counts toward max_restarts, and the group lives on for the others.
    sup = supervisors("""
[[worker]]
name = "ex"
types = ["ex"]
handler = "sup_handlers:exits"
max_restarts = 2
""").start()
    for _ in range(2):
        poison = sup.cli("submit", "ex", "--on-demand", "--payload", '{"code": 5}', timeout=60)
        assert poison.returncode == 1, poison.stderr
        assert "exited with code 5" in poison.stderr, poison.stderr
    fine = sup.cli("submit", "ex", "--on-demand", timeout=60)
    assert fine.returncode == 0, fine.stderr
    (row,) = sup.slots("ex")
    assert row["state"] == "free" and row["restarts"] == 6, row
    out = sup.output()
    assert out.count("(not counted toward max_restarts: job od-1 crashed a worker before)") == 2
    assert out.count("(not counted toward max_restarts: job od-2 crashed a worker before)") == 2
