"""The supervisor's own life as an operator meets it: its state_dir and embedded database
pulled from under it, its stop while callers wait."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

ECHO = """
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:echo"
"""


def test_a_state_dir_deleted_under_a_running_supervisor_is_told_without_tracebacks(supervisors):
    sup = supervisors(ECHO)
    del sup.env["FAIRSCHED_DATABASE_URL"]  # the embedded server, in the state_dir
    sup.start()
    shutil.rmtree(sup.dir / "state")
    sup.wait_output(r"lost the database: .*; reconnecting")
    # Reconnecting finds nowhere to start the server again, time after time.
    sup.wait_output(r"is gone \(restart the supervisor\); trying again")
    # Said once over the attempts that follow (0.2, 0.4, 0.8 s... apart). An attempt that
    # finds the folder gone leaves no trace outside the process (no line, no file, no row:
    # that is the point), so the window is a bound on the clock: 2 s hold four attempts.
    time.sleep(2)
    assert sup.output().count("is gone (restart the supervisor)") == 1, sup.output()[-3000:]
    assert "Traceback" not in sup.output(), sup.output()[-3000:]
    assert "claim lane failed" not in sup.output()
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(timeout=30) == 0, sup.output()[-3000:]  # no job outcome was lost
    assert "Traceback" not in sup.output(), sup.output()[-3000:]


def test_a_supervisor_started_with_its_standard_streams_closed_fills_them_with_dev_null(
        supervisors):
    # Else the first files it opens (its lock file, a worker's socket) would take those
    # numbers, and whatever is written to standard error would land in them.
    sup = supervisors(ECHO)
    sup.proc = subprocess.Popen(
        ["sh", "-c", 'exec "$0" -m fairsched supervise --config "$1" <&- >&- 2>&-',
         sys.executable, str(sup.config)], env=sup.env)
    sup.wait_for(lambda ps: all(s["state"] == "free" for s in ps["slots"]), what="ready")
    assert [os.readlink(f"/proc/{sup.proc.pid}/fd/{fd}") for fd in (0, 1, 2)] == [
        os.devnull] * 3
    result = sup.cli("submit", "pdf", "--on-demand", "--payload", '{"n": 1}')
    assert result.returncode == 0 and json.loads(result.stdout)["payload"] == {"n": 1}, result
    assert sup.cli("stop").returncode == 0
    assert sup.wait_exit() == 0


def test_restart_and_stop_that_cannot_print_say_what_they_did(supervisors):
    # Standard output closed (`>&-`): each acted, then exited 0 saying nothing.
    sup = supervisors(ECHO).start()
    pid = sup.ps()["slots"][0]["pid"]

    def closed(*args):
        return subprocess.run([sys.executable, "-m", "fairsched", *args], env=sup.env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              timeout=60, preexec_fn=lambda: os.close(1))

    restarted = closed("restart", "pdf")
    assert (restarted.returncode, restarted.stderr) == (
        1, "fairsched: restarting pdf-1, but this could not be printed:"
           " standard output is closed\n")
    sup.wait_for(lambda ps: ps["slots"][0]["state"] == "free"
                 and ps["slots"][0]["pid"] != pid, what="pdf-1 restarted")
    stopped = closed("stop")
    assert (stopped.returncode, stopped.stderr) == (
        1, f"fairsched: supervisor {sup.proc.pid} stopped, but this could not be printed:"
           " standard output is closed\n")
    assert sup.wait_exit() == 0


def test_a_second_supervisor_on_a_state_dir_with_a_line_break_says_so_on_one_line(supervisors):
    sup = supervisors(ECHO)
    sup.config.write_text(sup.config.read_text().replace('state_dir = "state"',
                                                         'state_dir = "st\\nate"'))
    sup.start()
    pid = sup.ps()["supervisor"]["pid"]
    state = sup.dir / "st\nate"
    second = sup.cli("supervise")
    assert (second.returncode, second.stdout) == (2, ""), second.stderr
    assert second.stderr == (f"fairsched: another supervisor (pid {pid}) is running on "
                             f"{str(state)!r}; stop it first (`fairsched stop`)\n")
