"""Workers that misbehave under a real supervisor: what the operator sees, and that the
supervisor and the jobs around them are not the ones to pay for it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from fairsched.store.aqueue import MAX_ERROR
from tests.supervisor_harness import wait_until

SLOW = """
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:slow"
max_attempts = 1
"""

ECHO = """
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:echo"
"""

ECHO_TWO = """
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:echo"
processes = 2
"""


def test_a_job_waiting_is_not_handed_to_a_worker_stopped_from_elsewhere(supervisors):
    """A SIGTERM from elsewhere: the worker's running job stops early and fails (it was not
    asked to stop it), and the worker leaves; the job waiting behind it is not handed to the
    worker on its way out, to fail unrun, but runs on its replacement."""
    sup = supervisors(SLOW).start()
    pid = sup.slots("pdf")[0]["pid"]
    first = sup.spawn_cli("submit", "pdf", "--on-demand", "--payload", '{"seconds": 60}')
    sup.wait_for(lambda ps: ps["slots"][0]["job_id"] is not None, what="the first job running")
    second = sup.spawn_cli("submit", "pdf", "--on-demand", "--payload", '{"seconds": 0.1}')
    sup.wait_for(lambda ps: ps["supervisor"]["waiting_on_demand"] == 1, what="the second waiting")
    os.kill(pid, signal.SIGTERM)
    out, err = first.communicate(timeout=30)
    assert first.returncode == 1 and "stopped it unasked" in err, (out, err)
    out, err = second.communicate(timeout=30)
    assert second.returncode == 0, (out, err, sup.output()[-2000:])
    assert json.loads(out)["attempt"] == 1 and json.loads(out)["pid"] != pid, out


def test_a_worker_whose_log_cannot_be_opened_is_fatal_and_its_template_stays(supervisors):
    """The log is the worker's own problem (a directory in its place, a full disk): it is
    fatal saying so, while its template goes on forking the group's other workers."""
    sup = supervisors(ECHO_TWO)
    (sup.dir / "state" / "logs" / "pdf-2.log").mkdir(parents=True)
    sup.start()
    sup.wait_output(r"worker pdf-2 is fatal: could not start: \[Errno 21\] Is a directory: "
                    r"'.*/pdf-2\.log'; ")
    pid = sup.slots("pdf-1")[0]["pid"]
    os.kill(pid, signal.SIGKILL)
    sup.wait_for(lambda ps: ps["slots"][0]["state"] == "free"
                 and ps["slots"][0]["pid"] not in (None, pid), what="pdf-1 back")
    assert "template for pdf failed" not in sup.output(), sup.output()
    assert "template for pdf exited" not in sup.output(), sup.output()
    assert sup.output().count("template for pdf is importing") == 1, sup.output()


def test_a_worker_directory_gone_since_its_template_started_is_one_clear_line(supervisors):
    """Forked from the template into a directory removed meanwhile: 'could not start', fatal
    at once, as a cold start says it, not a traceback and a crash loop."""
    sup = supervisors("""
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:echo"
cwd = "sub"
""")
    (sup.dir / "sub").mkdir()
    shutil.copy(sup.dir / "sup_handlers.py", sup.dir / "sub")
    sup.start()
    pid = sup.slots("pdf")[0]["pid"]
    shutil.rmtree(sup.dir / "sub")
    os.kill(pid, signal.SIGKILL)
    slot = sup.wait_for(lambda ps: ps["slots"][0]["state"] == "fatal", what="pdf-1 fatal")
    reason = slot["slots"][0]["fatal_reason"]
    assert reason.startswith("could not start: cannot enter worker directory '"), reason
    assert "exited with code 70" not in sup.output(), sup.output()


def test_a_template_stuck_in_a_fork_hook_does_not_hang_the_supervisor(supervisors):
    """The handler's import registers a fork hook that never returns: the template answers
    no spawn request. The supervisor does not wait on it: at the end of start_timeout it
    kills the template, its workers start cold, and `fairsched ps` answers meanwhile."""
    sup = supervisors("""
[[worker]]
name = "hook"
types = ["hook"]
handler = "fork_hook:handle"
processes = 12
start_timeout = 3
""")
    (sup.dir / "fork_hook.py").write_text(
        "import os\nimport time\n\nos.register_at_fork(before=lambda: time.sleep(1000))\n\n\n"
        "def handle(job):\n    return os.getpid()\n")
    sup.start(wait=False)
    sup.wait_for(lambda ps: all(s["state"] == "starting" for s in ps["slots"]),
                 what="ps answering while the template is stuck")
    sup.wait_output(r"template for hook did not start worker hook-\d+ within 3 s "
                    r"\(start_timeout\); killing it, its workers start cold", timeout=30)
    sup.wait_for(lambda ps: len(ps["slots"]) == 12
                 and all(s["state"] == "free" for s in ps["slots"]), timeout=60,
                 what="every worker started cold")
    assert sup.cli("submit", "hook", "--on-demand", timeout=30).returncode == 0


def test_a_fifo_without_reader_in_place_of_a_log_does_not_hang_the_supervisor(supervisors):
    sup = supervisors(ECHO_TWO)
    logs = sup.dir / "state" / "logs"
    logs.mkdir(parents=True)
    os.mkfifo(logs / "pdf-2.log")
    sup.start(wait=False)
    sup.wait_output(r"worker pdf-2 is fatal: could not start: \[Errno 6\] No such device or "
                    r"address: '.*/pdf-2\.log'; ")
    sup.wait_for(lambda ps: [s["state"] for s in ps["slots"]] == ["free", "fatal"],
                 what="pdf-1 running beside the fatal pdf-2")


def test_a_worker_logging_to_a_fifo_that_dies_before_its_hello_leaves_the_supervisor_free(
        supervisors):
    """Its log is a FIFO read by another program: the last line is not read from there
    (that would wait for a writer, for good once the reader is gone too)."""
    sup = supervisors(ECHO)
    logs = sup.dir / "state" / "logs"
    logs.mkdir(parents=True)
    os.mkfifo(logs / "pdf-1.log")
    reader = subprocess.Popen(["cat", str(logs / "pdf-1.log")], stdout=subprocess.DEVNULL)
    try:
        (sup.dir / "crash-at-start").write_text("")
        sup.start(wait=False)
        sup.wait_output(r"worker pdf-1 exited with code 3 before its hello \(its log ends: "
                        r"not a file\)")
        sup.wait_for(lambda ps: ps["slots"][0]["state"] == "fatal", what="pdf-1 fatal")
    finally:
        reader.kill()
        reader.wait()


def test_a_slot_freed_on_a_worker_stopped_from_elsewhere_shows_as_stopping(supervisors):
    """A SIGTERM from elsewhere to a worker with two slots: the job that stops frees its slot,
    which takes no more work while the other job runs on; ps says so instead of 'free'."""
    sup = supervisors(SLOW + "slots = 2\n").start()
    pid = sup.slots("pdf")[0]["pid"]
    stubborn = sup.spawn_cli("submit", "pdf", "--on-demand", "--payload",
                             '{"seconds": 60, "ignore_cancel": true}')
    polite = sup.spawn_cli("submit", "pdf", "--on-demand", "--payload", '{"seconds": 60}')
    sup.wait_for(lambda ps: all(s["state"] == "busy" for s in ps["slots"]), what="both busy")
    os.kill(pid, signal.SIGTERM)
    out, err = polite.communicate(timeout=30)
    assert polite.returncode == 1 and "stopped it unasked" in err, (out, err)
    slots = sup.slots("pdf")
    assert [s["pid"] for s in slots] == [pid, pid], slots
    assert sorted(s["state"] for s in slots) == ["busy", "stopping"], slots
    table = sup.cli("ps").stdout
    assert re.search(rf"^pdf-1 +{pid} +\d +pdf +stopping ", table, re.M), table
    stubborn.kill()


def _misbehaving(supervisors, mode: str, settings: str = "", name: str = "odd"):
    script = Path(__file__).parent / "handlers" / "garbage_worker.py"
    return supervisors(f"""
[[worker]]
name = "{name}"
types = ["{name}"]
command = ["{sys.executable}", "{script}", "{mode}"]
max_attempts = 1
{settings}""")


def test_messages_for_jobs_a_worker_does_not_run_are_logged_once_per_process(supervisors):
    # Progress after its result, results for jobs it was never given: each one is ignored,
    # and a worker that sends hundreds of them gets one warning, not hundreds of log lines.
    sup = _misbehaving(supervisors, "chatty", name="chat").start()
    pid = sup.slots("chat")[0]["pid"]
    for _ in range(2):
        result = sup.cli("submit", "chat", "--on-demand", timeout=30)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout) == {"pid": pid}  # the same worker: not killed for it
    # Frames arrive in order: the second job's result came after the first job's 600 frames.
    warnings = re.findall(r"worker chat-1 sent \w+ for job .*; ignored \(said once per "
                          r"process\)", sup.output())
    assert len(warnings) == 1, sup.output()[-2000:]
    assert "which is not running there" in warnings[0]
    assert sup.slots("chat")[0]["pid"] == pid


def test_a_long_error_from_a_worker_is_quoted_short_in_the_log_and_kept_in_the_table(supervisors):
    # A worker may send a frame's worth (1 MiB) of error: the log quotes a line's worth of it
    # and says how long it is; the job table keeps much more (MAX_ERROR characters).
    sup = _misbehaving(supervisors, "picky").start()
    error = "disk full; " * 40_000 + "giving up"
    job_id = sup.cli("submit", "odd", "--payload", "-",
                     input=json.dumps({"error": error})).stdout.strip()
    line = sup.wait_output(rf"job {job_id} failed for good: .*").group()
    assert line.endswith(f": {error[:1000]}... (440009 characters in all)"), line[:300]
    assert len(sup.output()) < 20_000
    jobs = json.loads(sup.cli("jobs", "--json").stdout)
    assert jobs[0]["last_error"] == error[:MAX_ERROR]


def test_a_long_fatal_message_is_quoted_short_in_the_log_and_in_ps(supervisors):
    why = "no licence: " + "x" * 100_000
    sup = _misbehaving(supervisors, "fatal", f'env = {{ FATAL_ERROR = "{why}" }}').start()
    row = sup.wait_for(lambda ps: ps["slots"][0]["state"] == "fatal", what="odd fatal")["slots"][0]
    # Its words after a colon: in parentheses, theirs would close beside fairsched's, "))".
    assert row["fatal_reason"] == f"could not start: {why[:1000]}... (100012 characters in all)"
    assert f"worker odd-1 cannot start: {why[:1000]}... (100012 characters in all)\n" in sup.output()
    assert len(sup.output()) < 20_000
    table = sup.cli("ps").stdout
    assert len(table) < 5_000
    assert "(100012 characters in all) (fix it, then `fairsched restart odd-1`)" in table, table
    assert "))" not in table, table


def test_a_result_ahead_of_a_bad_frame_in_one_write_is_the_jobs_outcome(supervisors):
    # The result came in good order before the stray frame: the job succeeded, whether the two
    # reach the supervisor in one read or in two; the worker is killed for the bad frame.
    sup = _misbehaving(supervisors, "trailing").start()
    pid = sup.slots("odd")[0]["pid"]
    job_id = sup.cli("submit", "odd").stdout.strip()
    sup.wait_output(r"worker odd-1 sent a bad frame: frame is not valid JSON")
    job = wait_until(lambda: next((j for j in json.loads(sup.cli("jobs", "--json").stdout)
                                   if j["status"] != "running"), None), what="job ended")
    assert (job["id"], job["status"], job["result"]) == (int(job_id), "succeeded", {"ok": 1}), job
    assert f"job {job_id} succeeded" in sup.output()
    sup.wait_for(lambda ps: ps["slots"][0]["pid"] not in (None, pid), what="odd replaced")


def test_a_long_progress_message_is_quoted_short_in_ps_and_to_the_caller(supervisors):
    sup = _misbehaving(supervisors, "verbose").start()
    caller = sup.spawn_cli("submit", "odd", "--on-demand", "--timeout", "60")
    sup.wait_for(lambda ps: sup.slots("odd")[0]["progress"], what="its progress")
    (row,) = sup.slots("odd")
    assert row["message"] == "M" * 1000 + "... (1000000 characters in all)", row["message"][-99:]
    assert len(sup.cli("ps", "--json").stdout) < 20_000
    caller.kill()
    caller.wait()
