"""Ctrl-C on a command that waits: exit 130 and one line saying so, never a traceback."""

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.pg_proxy import PgProxy
from tests.supervisor_harness import reading, wait_until

SLOW_PDF = """
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:slow"
"""


def interrupted(proc) -> str:
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert (proc.returncode, out) == (130, ""), (proc.returncode, out, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_ctrl_c_while_an_on_demand_job_runs_withdraws_it_in_one_line(supervisors):
    sup = supervisors(SLOW_PDF).start()
    caller = sup.spawn_cli("submit", "pdf", "--on-demand", "--payload", '{"seconds": 30}')
    sup.wait_for(lambda ps: ps["slots"][0]["message"] == "started", what="the job started")
    # The command has read the supervisor's "accepted" (sent before the job started), which
    # names the job, once it waits on its socket for more.
    wait_until(lambda: reading(caller.pid), what="the command waiting for the job's events")
    line = interrupted(caller)
    assert line.startswith("fairsched: interrupted"), line
    assert "od-1" in line and "withdrawn" in line, line
    # The supervisor heard the caller leave: the handler was asked to stop, the slot is free.
    sup.wait_for(lambda ps: ps["slots"][0]["state"] == "free", what="the slot free again")


def test_ctrl_c_while_stop_waits_is_one_line(supervisors):
    sup = supervisors(SLOW_PDF, shutdown_timeout=30).start()
    caller = sup.spawn_cli("submit", "pdf", "--on-demand", "--payload",
                           '{"seconds": 30, "ignore_cancel": true}')
    sup.wait_for(lambda ps: ps["slots"][0]["message"] == "started", what="the job started")
    stopper = sup.spawn_cli("stop")
    sup.wait_for(lambda ps: ps["supervisor"].get("shutting_down"), what="shutting down")
    line = interrupted(stopper)
    assert line == "fairsched: interrupted", line
    caller.kill()


def test_ctrl_c_while_a_command_waits_on_a_silent_database_is_one_line(db, tmp_path):
    proxy = PgProxy(db)
    try:
        proxy.lose_answer_to(b"FROM fairsched_jobs")  # the listing's query is never answered
        proc = subprocess.Popen(
            [sys.executable, "-m", "fairsched", "jobs"], cwd=tmp_path, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=dict(os.environ, FAIRSCHED_DATABASE_URL=proxy.url_through))
        wait_until(lambda: proxy.answer_lost or proc.poll() is not None,
                   what="the listing's query sent")  # connected, migrations checked
        assert proc.poll() is None, proc.communicate()
        assert interrupted(proc) == "fairsched: interrupted"
    finally:
        proxy.close()


# Ctrl-C lands while the command line is being imported: as the import of click begins.
CTRL_C_WHILE_LOADING = """
import os, signal, sys, time

class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "click":
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the KeyboardInterrupt comes out of this sleep
        return None

sys.meta_path.insert(0, CtrlC())
from fairsched.__main__ import run  # what the fairsched command runs

run()
"""


def test_ctrl_c_while_the_command_line_is_still_loading_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-c", CTRL_C_WHILE_LOADING, "jobs"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=20)
    assert (result.returncode, result.stdout, result.stderr) == (
        130, "", "fairsched: interrupted\n"), result.stderr
    fairsched = Path(sys.executable).with_name("fairsched")
    assert "from fairsched.__main__ import run" in fairsched.read_text()
