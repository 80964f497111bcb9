"""Workers that misbehave under a real supervisor: what the operator sees, and that the
supervisor and the jobs around them are not the ones to pay for it."""

from __future__ import annotations

import json
import os
import signal

SLOW = """
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:slow"
max_attempts = 1
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
