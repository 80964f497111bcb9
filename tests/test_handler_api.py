"""Handlers as their authors write them, run by a real supervisor: what each shape of handler
gets for its jobs, seen from the command line."""

from __future__ import annotations

import json
import re

import pytest


def worker(handler: str, extra: str = "") -> str:
    return f"""
[[worker]]
name = "w"
types = ["t"]
handler = "sup_handlers:{handler}"
max_attempts = 1
{extra}"""


def test_a_plain_handler_returning_an_async_call_has_it_awaited(supervisors):
    sup = supervisors(worker("wraps_async")).start()
    ok = sup.cli("submit", "t", "--on-demand", "--payload", '{"page": 1}')
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["rendered"] == {"page": 1}
    failed = sup.cli("submit", "t", "--on-demand", "--payload", '{"fail": true}')
    assert failed.returncode == 1 and "the awaited call failed" in failed.stderr, failed.stderr
    assert "never awaited" not in (sup.dir / "state" / "logs" / "w-1.log").read_text()


@pytest.mark.parametrize(("code", "said"), [(None, "None"), (0, "0"), ("bad input", "'bad input'")])
def test_sys_exit_in_a_handler_fails_its_job_saying_so_and_the_worker_runs_on(supervisors, code,
                                                                              said):
    sup = supervisors(worker("exits_politely")).start()
    pid = sup.slots("w")[0]["pid"]
    failed = sup.cli("submit", "t", "--on-demand", "--payload", json.dumps({"code": code}))
    assert failed.returncode == 1
    assert failed.stderr.strip().endswith(
        f"failed: SystemExit: the handler called sys.exit() (code {said}): its job fails, its "
        "worker runs on"), failed.stderr
    ok = sup.cli("submit", "t", "--on-demand")
    assert ok.returncode == 0 and json.loads(ok.stdout) == {"pid": pid}, ok.stderr
    slot = sup.slots("w")[0]
    assert (slot["pid"], slot["restarts"], slot["state"]) == (pid, 0, "free"), slot


def test_a_group_with_a_large_env_still_gets_workers_forked_from_its_template(supervisors):
    # Two variables of 120,000 characters: more than a spawn request to the template could
    # carry in one datagram, were the group's env in it.
    big = {"BIG1": "a" * 120_000, "BIG2": "b" * 120_000}
    sup = supervisors(worker("environment_sizes", "processes = 2\nenv = "
                             + "{" + ", ".join(f'{k} = "{v}"' for k, v in big.items()) + "}"))
    sup.start()
    for _ in range(2):
        done = sup.cli("submit", "t", "--on-demand", "--payload", '{"names": ["BIG1", "BIG2"]}')
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"forked": True, "sizes": [120_000, 120_000]}
    assert "starting it cold" not in sup.output() and "template for w" in sup.output()


def test_a_handler_that_closes_the_workers_channel_ends_it_saying_so(supervisors):
    # The supervisor may read the end of the pipe a moment before it can reap the worker
    # (the last of its threads still exiting): its job's error waits for that exit, every
    # time, and does not say only that the pipe closed.
    # Each crash restarts the worker at once: it is the only one within its restart_window.
    sup = supervisors(worker("closes_its_channel", "restart_window = 0.01")).start()
    said = "exited with code 70 (its log ends: "
    why = ("fairsched worker w-1: fd 3, the channel to the supervisor, failed: Bad file "
           "descriptor (closed or reused by a handler?))")
    for run in range(12):  # a race: the end of the pipe came first in about 1 run in 3
        failed = sup.cli("submit", "t", "--on-demand")
        assert failed.returncode == 1, failed.stderr
        assert failed.stderr.startswith(f"fairsched: job od-{run + 1} failed: worker w-1 "
                                        + said), (run, failed.stderr)
        assert failed.stderr.endswith(why + "\n"), (run, failed.stderr)
    slot = sup.wait_for(lambda ps: ps["slots"][0]["last_exit"] is not None,
                        what="w-1's exit")["slots"][0]
    assert slot["last_exit"].startswith(said) and slot["last_exit"].endswith(why), slot
    assert re.search(rf"worker w-1 {re.escape(said)}.*{re.escape(why)}", sup.output())


@pytest.mark.parametrize(("field", "value"), [("slot", 3), ("id", "renamed"), ("type", "other")])
def test_a_handler_that_assigns_its_jobs_fields_fails_that_job_and_its_worker_runs_on(
        supervisors, field, value):
    sup = supervisors(worker("rewrites_its_job", "slots = 2")).start()
    pid = sup.slots("w")[0]["pid"]
    failed = sup.cli("submit", "t", "--on-demand", "--timeout", "10", "--payload",
                     json.dumps({"field": field, "value": value}))
    assert failed.returncode == 1, failed.stdout
    assert failed.stderr.strip().endswith(
        f"failed: AttributeError: a job's {field} cannot be changed (it says which job this is)"
    ), failed.stderr
    for _ in range(3):  # both slots free again, on the same worker
        ok = sup.cli("submit", "t", "--on-demand", "--timeout", "10")
        assert ok.returncode == 0 and json.loads(ok.stdout) == {"pid": pid}, ok.stderr
    assert "not running" not in sup.output() and "ignored" not in sup.output()


def test_standard_streams_a_handler_closed_are_back_on_the_log_for_the_next_job(supervisors):
    sup = supervisors(worker("closes_standard_streams")).start()
    closed = sup.cli("submit", "t", "--on-demand", "--payload", '{"close": true}')
    assert closed.returncode == 0, closed.stderr
    data = sup.dir / "data.txt"
    failed = sup.cli("submit", "t", "--on-demand", "--payload", json.dumps({"file": str(data)}))
    assert failed.stderr.strip().endswith("failed: ValueError: failed after opening a file")
    assert data.read_text() == "data\n"  # neither the handler's print nor the traceback
    log = (sup.dir / "state" / "logs" / "w-1.log").read_text()
    assert "job od-1 (t) closed fd 0, 1, 2; opened again (0 on /dev/null, 1 and 2 on this log)" \
        in log, log
    assert "said by the handler" in log and "ValueError: failed after opening a file" in log


def test_programs_a_handler_runs_do_not_inherit_the_workers_channel(supervisors):
    # A script that writes to fd 3 when it is open (a status channel, say) wrote into the
    # worker's frames, and the worker was killed for a bad frame.
    sup = supervisors(worker("runs_a_shell")).start()
    pid = sup.slots("w")[0]["pid"]
    for command in ["printf garbage >&3 2>/dev/null", "test -e /proc/self/fd/3"]:
        done = sup.cli("submit", "t", "--on-demand", "--payload",
                       json.dumps({"command": command}))
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert result["status"] != 0 and result["pid"] == pid, (command, result)  # no fd 3
    assert "bad frame" not in sup.output()


def test_output_a_handler_left_redirected_to_a_closed_file_goes_to_the_log_again(supervisors):
    sup = supervisors(worker("redirects_its_output")).start()
    pid = sup.slots("w")[0]["pid"]
    redirected = sup.cli("submit", "t", "--on-demand", "--payload",
                         json.dumps({"file": str(sup.dir / "out.txt")}))
    assert redirected.returncode == 0, redirected.stderr
    after = sup.cli("submit", "t", "--on-demand")
    assert after.returncode == 0 and json.loads(after.stdout) == {"pid": pid}, after.stderr
    log = (sup.dir / "state" / "logs" / "w-1.log").read_text()
    assert "job od-1 (t) left sys.stdout, sys.stderr closed; put back on fd 1, 2" in log, log
    assert "said by the next job" in log and "warned by the next job" in log, log


def test_a_stream_a_handler_left_that_cannot_say_if_it_is_closed_is_left_alone(supervisors):
    sup = supervisors(worker("redirects_its_output")).start()
    pid = sup.slots("w")[0]["pid"]
    for payload in ['{"odd": true}', "{}", "{}"]:
        done = sup.cli("submit", "t", "--on-demand", "--timeout", "10", "--payload", payload)
        assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"pid": pid}
    assert "said by the next job" in (sup.dir / "state" / "logs" / "w-1.log").read_text()


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_job_given_to_a_process_pool_arrives_there_as_a_copy(supervisors, start):
    sup = supervisors(worker("hands_its_job_to_a_pool")).start()
    done = sup.cli("submit", "t", "--on-demand", "--payload", json.dumps({"n": 21, "start": start}))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"doubled": 42, "id": "od-1", "cancelled": False}


def test_a_handler_printing_onto_a_full_disk_finishes_its_jobs_and_the_log_says_so_once(
        supervisors):
    # /dev/full answers every write with ENOSPC, as a full file system under the logs does.
    sup = supervisors(worker("prints_much"))
    logs = sup.dir / "state" / "logs"
    logs.mkdir(parents=True)
    (logs / "w-1.log").symlink_to("/dev/full")
    sup.start()
    pid = sup.slots("w")[0]["pid"]
    for _ in range(2):
        done = sup.cli("submit", "t", "--on-demand", "--payload", '{"lines": 500}')
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"printed": 500, "pid": pid}
    said = [line for line in sup.output().splitlines() if "cannot write to its log" in line]
    assert len(said) == 1, sup.output()
    assert said[0].endswith(
        f"worker w-1 cannot write to its log {logs / 'w-1.log'}: No space left on device; what "
        "its jobs print is lost until there is room (said once per process)"), said[0]
    assert sup.slots("w")[0]["restarts"] == 0


@pytest.mark.parametrize("start", ["template", "cold"])
def test_a_handler_module_that_prints_at_import_onto_a_full_disk_still_starts(supervisors,
                                                                              start):
    # A thread started at import makes its workers start cold, each importing it.
    thread = ("import threading, time\n"
              "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n")
    sup = supervisors('[[worker]]\nname = "w"\ntypes = ["t"]\nhandler = "banner:run"\n')
    (sup.dir / "banner.py").write_text(
        "import os\n" + (thread if start == "cold" else "")
        + "for n in range(100):\n    print('loading the model', n, '.' * 100)\n"
        + "def run(job):\n    return {'pid': os.getpid()}\n")
    logs = sup.dir / "state" / "logs"
    logs.mkdir(parents=True)
    for name in ("w-1.log", "w.template.log"):
        (logs / name).symlink_to("/dev/full")
    sup.start()
    (slot,) = sup.slots("w")
    assert (slot["state"], slot["restarts"]) == ("free", 0), sup.output()
    done = sup.cli("submit", "t", "--on-demand")
    assert done.returncode == 0 and json.loads(done.stdout) == {"pid": slot["pid"]}, done.stderr
    sup.wait_output(r"worker w-1 cannot write to its log .*: No space left on device")
    assert ("its workers start cold" in sup.output()) == (start == "cold"), sup.output()
