"""The supervisor's own life as an operator meets it: its state_dir and embedded database
pulled from under it, its stop while callers wait."""

import shutil
import signal
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
    time.sleep(2)  # attempts after 0.2, 0.4, 0.8 s...: said once
    assert sup.output().count("is gone (restart the supervisor)") == 1, sup.output()[-3000:]
    assert "Traceback" not in sup.output(), sup.output()[-3000:]
    assert "claim lane failed" not in sup.output()
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(timeout=30) in (0, 1), sup.output()[-3000:]
    assert "Traceback" not in sup.output(), sup.output()[-3000:]
