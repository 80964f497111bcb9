"""Real worker processes started with launch(), driven through their socketpair by the test."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import time
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from handlers.worker_peer import HERE, Peer, make_spec

from fairsched import Job
from fairsched.logs import unstamped
from fairsched.protocol import encode
from fairsched.worker.launch import LaunchError, launch
from tests.supervisor_harness import wait_until

STANDALONE = Path(__file__).parent.parent / "examples" / "standalone_worker.py"


@pytest.fixture
def start(tmp_path):
    """start(**spec fields) -> Peer for a cold-launched worker; all are killed and reaped after."""
    peers: list[Peer] = []

    def start(incarnation="inc-1", **fields) -> Peer:
        spec = make_spec(tmp_path, **fields)
        peer = Peer(launch(spec, incarnation), incarnation, spec)
        peers.append(peer)
        return peer

    yield start
    for peer in peers:
        peer.cleanup()


def test_hello_comes_first_and_describes_the_worker(start):
    peer = start(types=("echo", "other"), slots=2)
    hello = peer.hello()
    assert hello == {"t": "hello", "protocol": 1, "pid": peer.pid, "incarnation": "inc-1",
                     "slots": 2, "types": ["echo", "other"]}


def test_run_returns_the_handlers_result_with_the_job_fields(start):
    peer = start()
    peer.hello()
    peer.run(7, payload={"n": [1, 2]}, priority=4, attempt=2)
    assert peer.expect("result") == {
        "t": "result", "slot": 0, "job_id": 7,
        "result": {"id": 7, "type": "echo", "payload": {"n": [1, 2]}, "priority": 4,
                   "attempt": 2, "on_demand": False, "slot": 0, "pid": peer.pid,
                   "imported_in": peer.pid}}
    peer.run("od-42", payload="text", on_demand=True)
    msg = peer.expect("result")
    assert msg["job_id"] == "od-42"  # string ids come back unchanged
    assert msg["result"]["on_demand"] is True and msg["result"]["payload"] == "text"


def test_launch_sets_up_environment_directory_session_and_stdin(start):
    peer = start(handler="worker_handlers:environment", env={"EXTRA": "yes"}, incarnation="i9")
    peer.hello()
    peer.run(1)
    seen = peer.expect("result")["result"]
    env = seen["env"]
    assert env["FAIRSCHED_FD"] == "3" and env["FAIRSCHED_PROTOCOL"] == "1"
    assert env["FAIRSCHED_WORKER"] == "w-1" and env["FAIRSCHED_GROUP"] == "w"
    assert env["FAIRSCHED_INCARNATION"] == "i9" and env["FAIRSCHED_SLOTS"] == "1"
    assert env["FAIRSCHED_TYPES"] == "echo"
    assert env["FAIRSCHED_HANDLER"] == "worker_handlers:environment"
    assert env["EXTRA"] == "yes"
    # The handler's folder is first on sys.path, not on PYTHONPATH: it would come before the
    # standard library for the worker's own imports too.
    assert seen["sys_path_0"] == str(HERE.resolve())
    assert str(HERE.resolve()) not in env.get("PYTHONPATH", "").split(os.pathsep)
    assert seen["cwd"] == str(HERE.resolve())
    assert seen["sid"] == peer.pid  # its own session, so killpg reaches all it starts
    assert seen["stdin_is_devnull"]


def test_handler_exception_is_a_retryable_error_with_traceback_in_the_log(start):
    peer = start(handler="worker_handlers:fail")
    peer.hello()
    peer.run(1, attempt=3)
    assert peer.expect("error") == {"t": "error", "slot": 0, "job_id": 1,
                                    "error": "RuntimeError: boom on attempt 3",
                                    "permanent": False}
    peer.run(2)  # the worker survives its handler's failures
    assert peer.expect("error")["job_id"] == 2
    peer.send({"t": "stop"})
    assert peer.wait_exit() == 0
    log = peer.log()
    assert "Traceback (most recent call last)" in log and "RuntimeError: boom on attempt 3" in log
    assert re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z job 1 \(echo\) failed, "
                     r"attempt 3:$", log, re.M), log


@pytest.mark.parametrize("payload", [{"close_stderr": True}, {"write_only_stderr": True}])
def test_a_log_that_cannot_be_written_does_not_hide_the_jobs_error(start, payload):
    peer = start(handler="worker_handlers:fail")
    peer.hello()
    peer.run(1, payload=payload)
    assert peer.expect("error")["error"] == "RuntimeError: boom on attempt 1"


def test_an_error_whose_message_cannot_be_made_is_still_permanent(start):
    peer = start(handler="worker_handlers:fail_unspeakably")
    peer.hello()
    peer.run(1)
    assert peer.expect("error") == {"t": "error", "slot": 0, "job_id": 1,
                                    "error": "Unspeakable", "permanent": True}


def test_a_handlers_fork_that_returns_does_not_answer_for_the_worker(start):
    peer = start(handler="worker_handlers:forks")
    peer.hello()
    for job_id in (1, 2):  # and the worker is still in step for the next job
        peer.run(job_id)
        msg = peer.expect("result")
        assert (msg["job_id"], msg["result"]) == (job_id, {"from": "parent"}), msg


def test_progress_from_a_handlers_forked_child_goes_nowhere(start):
    peer = start(handler="worker_handlers:forks_and_reports")
    peer.hello()
    peer.run(1)
    assert [(m["t"], m.get("message")) for m in (peer.recv(), peer.recv())] == [
        ("progress", "from the worker"), ("result", None)]


def test_a_signal_to_a_handlers_forked_child_is_the_childs_not_the_workers(start):
    # The child ends on its SIGTERM, and the worker, which did not get one, runs on.
    peer = start(handler="worker_handlers:terminates_a_child")
    peer.hello()
    for job_id in (1, 2):
        peer.run(job_id)
        assert peer.expect("result") == {"t": "result", "slot": 0, "job_id": job_id,
                                         "result": {"exitcode": -signal.SIGTERM,
                                                    "cancelled": False}}


@pytest.mark.parametrize(("payload", "error", "permanent"), [
    ("permanent", "PermanentError: this input can never work", True),
    ("transient", "ConnectionError: this input can never work", False),
])
def test_a_permanent_error_raised_in_a_task_group_is_permanent(start, payload, error, permanent):
    # asyncio's TaskGroup raises an ExceptionGroup of its tasks' failures: one that holds a
    # PermanentError would meet it again on a retry, and its message says what failed.
    peer = start(handler="worker_handlers:fails_in_a_task_group")
    peer.hello()
    peer.run(1, payload=payload)
    assert peer.expect("error") == {
        "t": "error", "slot": 0, "job_id": 1, "permanent": permanent,
        "error": f"ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception) [{error}]"}

def test_permanent_error_is_marked_permanent(start):
    peer = start(handler="worker_handlers:fail_permanently")
    peer.hello()
    peer.run(1)
    msg = peer.expect("error")
    assert msg["permanent"] is True
    assert msg["error"] == "PermanentError: this input can never work"
    peer.send({"t": "stop"})
    assert peer.wait_exit() == 0
    log = peer.log()  # in full, as for any failure
    assert "job 1 (echo) failed permanently, attempt 1:" in log
    assert "Traceback (most recent call last)" in log, log


@pytest.mark.parametrize(("handler", "words"), [
    ("worker_handlers:unserialisable", "result is not JSON-serialisable: TypeError"),
    ("worker_handlers:huge", "result is too large: frame of"),
    ("worker_handlers:unreadable",
     "result is not JSON-serialisable: RuntimeError: this mapping cannot be read"),
    # Deeper than the supervisor reads: a clear failure, not a frame that gets it killed.
    ("worker_handlers:deep", "result nests deeper than 499 levels"),
    # A yield left in a function the handler calls: what it means, not "Object of type
    # generator is not JSON serializable" (a handler with a yield of its own is not loaded).
    ("worker_handlers:dispatches_to_a_generator",
     "the handler returned a generator (a yield in it?): it must return its result"),
    ("worker_handlers:dispatches_to_an_async_generator",
     "the handler returned an async generator (a yield in it?): it must return its result"),
])
def test_result_that_cannot_be_sent_is_a_permanent_error_not_a_crash(start, handler, words):
    peer = start(handler=handler)
    peer.hello()
    peer.run(1, payload={"depth": 980})
    msg = peer.expect("error")
    assert msg["permanent"] is True and words in msg["error"]
    peer.run(2, payload={"depth": 980})
    assert peer.expect("error")["job_id"] == 2  # still serving


def test_a_result_as_deep_as_a_payload_may_be_goes_through(start):
    peer = start(handler="worker_handlers:deep")
    peer.hello()
    peer.run(1, payload={"depth": 499})
    assert peer.expect("result")["job_id"] == 1


def test_a_large_result_of_accented_text_goes_through_in_utf8(start):
    peer = start()
    peer.hello()
    peer.run(1, payload={"text": "é" * 200_000})  # 400 KB in UTF-8, 1.2 MB escaped
    assert peer.expect("result")["result"]["payload"]["text"] == "é" * 200_000


def test_an_async_handler_is_run_to_its_end(start):
    peer = start(handler="worker_handlers:async_echo", slots=2)
    peer.hello()
    peer.run(1, payload={"n": 1}, slot=0)
    peer.run(2, payload={"n": 2}, slot=1)
    results = {m["job_id"]: m["result"] for m in (peer.expect("result"), peer.expect("result"))}
    assert results == {1: {"payload": {"n": 1}, "awaited": True},
                       2: {"payload": {"n": 2}, "awaited": True}}


def test_an_object_with_an_async_call_is_run_to_its_end(start):
    peer = start(handler="worker_handlers:async_callable")
    peer.hello()
    peer.run(4)
    assert peer.expect("result")["result"] == {"called": 4}


@pytest.mark.parametrize(("handler", "outcome", "left"), [
    ("leaves_a_stubborn_task", "result", "1 task(s) its handler left running did not end within"
                                         " 1 s of their cancel; left behind"),
    ("leaves_a_thread", "error", "1 thread(s) its handler started (run_in_executor) still run;"
                                 " left behind"),
    ("leaves_a_generator", "result", "the async generators its handler left open did not close "
                                     "within 1 s; left behind"),
])
def test_what_an_async_handler_leaves_running_does_not_hold_its_job(start, handler, outcome,
                                                                    left):
    # asyncio.run waits for every task left over and every executor thread: the job never
    # reported (its slot taken until a timeout killed the worker, or for ever).
    peer = start(handler=f"worker_handlers:{handler}")
    peer.hello()
    began = time.monotonic()
    peer.run(1, payload={})
    msg = peer.expect(outcome)
    assert time.monotonic() - began < 5
    assert msg.get("result") == "returned" or msg.get("error") == "ValueError: gave up", msg
    assert f"job 1 (echo): {left}" in peer.log()
    peer.run(2, payload={})  # and the worker takes the next one
    assert peer.expect(outcome)["job_id"] == 2


def test_sys_exit_in_a_handler_fails_the_job_not_the_worker(start):
    peer = start(handler="worker_handlers:exit_in_handler")
    peer.hello()
    peer.run(1)
    assert peer.expect("error") == {"t": "error", "slot": 0, "job_id": 1,
                                    "error": "SystemExit: the handler called sys.exit() "
                                             "(code 3): its job fails, its worker runs on",
                                    "permanent": False}


@pytest.mark.parametrize(("run", "reason"), [
    ({"incarnation": "inc-0"}, "work for incarnation 'inc-0', this worker is 'inc-1'"),
    ({"slot": 2}, "slot 2 is out of range: this worker has slots 0..1"),
    ({"job_type": "pdf"}, "type 'pdf' is not handled here (handles echo)"),
])
def test_work_not_meant_for_this_worker_is_refused(start, run, reason):
    peer = start(slots=2)
    peer.hello()
    peer.run(5, **run)
    assert peer.recv() == {"t": "refused", "slot": run.get("slot", 0), "job_id": 5,
                           "reason": reason}
    peer.run(6, slot=1)
    assert peer.expect("result")["job_id"] == 6


def test_a_busy_slot_refuses_a_second_job_and_the_other_slot_takes_it(start):
    peer = start(handler="worker_handlers:until_cancelled", slots=2)
    peer.hello()
    peer.run(1, slot=0)
    assert peer.recv()["t"] == "progress"
    peer.run(2, slot=0)
    assert peer.recv() == {"t": "refused", "slot": 0, "job_id": 2,
                           "reason": "slot 0 is busy with job 1"}
    peer.run(3, slot=1)
    assert peer.recv()["job_id"] == 3
    peer.cancel(1, slot=0)
    peer.cancel(3, slot=1)
    results = {peer.expect("result")["job_id"] for _ in range(2)}
    assert results == {1, 3}


def test_two_slots_run_two_jobs_at_once(start, tmp_path):
    peer = start(handler="worker_handlers:rendezvous", slots=2)
    peer.hello()
    peer.run("a", slot=0, payload={"dir": str(tmp_path), "me": "a", "other": "b"})
    peer.run("b", slot=1, payload={"dir": str(tmp_path), "me": "b", "other": "a"})
    results = {m["job_id"]: m["result"] for m in (peer.expect("result"), peer.expect("result"))}
    assert results == {"a": {"met": True, "slot": 0}, "b": {"met": True, "slot": 1}}


def runs(peer, job_ids, job_type="echo", payload=None) -> bytes:
    """One write holding a run frame per job, job i on slot i."""
    return b"".join(
        encode({"t": "run", "incarnation": peer.incarnation, "slot": slot,
                "job": {"id": job_id, "type": job_type, "payload": payload, "priority": 0,
                        "attempt": 1, "on_demand": False}})
        for slot, job_id in enumerate(job_ids))


def test_a_burst_of_long_jobs_runs_all_at_once(start):
    """Jobs read in one burst each get a thread, though none of them ever returns."""
    peer = start(handler="worker_handlers:until_cancelled", slots=8)
    peer.hello()
    peer.sock.sendall(runs(peer, range(8)))
    assert {peer.expect("progress")["job_id"] for _ in range(8)} == set(range(8))
    for slot in range(8):
        peer.cancel(slot, slot=slot)
    results = [peer.expect("result") for _ in range(8)]
    assert all(m["result"] == {"cancelled": True} for m in results)


@pytest.mark.parametrize("slots", [1, 4])
def test_job_threads_are_reused_and_never_outnumber_the_slots(start, slots):
    """Threads are kept between jobs: wave after wave, never more than one per slot."""
    peer = start(handler="worker_handlers:threads", slots=slots)
    peer.hello()
    seen = []
    for wave in range(400 // slots):
        peer.sock.sendall(runs(peer, range(wave * slots, (wave + 1) * slots)))
        seen += [peer.expect("result")["result"] for _ in range(slots)]
    assert len(seen) == 400
    assert max(seen) <= 1 + slots  # the main thread and at most one per slot


def test_a_slot_freed_while_its_thread_is_still_writing_gets_no_new_thread(start):
    """Job 1's result waits for the write lock (a flood of progress from slot 0 holds it) with
    its slot already free; job 2 for that slot waits for job 1's thread instead of a third
    thread being started for a worker of two slots."""
    peer = start(handler="worker_handlers:threads", slots=2)
    peer.hello()
    peer.run("flood", slot=0, payload="flood")
    time.sleep(0.3)  # unread: the flood fills the socket and blocks holding the write lock
    peer.run(1, slot=1)
    time.sleep(0.3)  # job 1 is done, its thread waits to write the result
    peer.run(2, slot=1)
    time.sleep(0.3)
    results = {}
    while len(results) < 3:
        msg = peer.recv()
        if msg["t"] == "result":
            results[msg["job_id"]] = msg["result"]
    assert max(results.values()) <= 1 + 2, results  # the main thread and one per slot


def test_cancel_reaches_job_cancelled(start):
    peer = start(handler="worker_handlers:until_cancelled")
    peer.hello()
    peer.run(1)
    assert peer.recv()["t"] == "progress"  # the handler is running
    peer.cancel(99)  # another job's id: ignored
    peer.cancel(1)
    result = peer.expect("result")
    assert result["result"] == {"cancelled": True}
    assert result["stopped"] is True  # it saw the cancel: what it returned is not the job done


@pytest.mark.parametrize("raised", ["retryable", "permanent"])
def test_a_handler_that_raises_once_it_saw_the_cancel_stopped_early(start, raised):
    # Asking is what counts: raising to stop is stopping, not a failure of the job, so a
    # shutdown or a restart hands it back unspent.
    peer = start(handler="worker_handlers:until_cancelled")
    peer.hello()
    peer.run(1, payload={"raise": raised})
    assert peer.recv()["t"] == "progress"
    peer.cancel(1)
    assert peer.expect("result") == {"t": "result", "slot": 0, "job_id": 1, "result": None,
                                     "stopped": True}
    assert "job 1 (echo) stopped early on a cancel, raising " in peer.log()


def test_a_handler_that_returns_what_json_cannot_hold_once_it_saw_the_cancel_stopped_early(
        start):
    # What a job that stopped early returns is not kept, so it need not be JSON: the stop
    # counts (a shutdown hands the job back), not a permanent failure of the job.
    peer = start(handler="worker_handlers:until_cancelled")
    peer.hello()
    peer.run(1, payload={"partial": True})
    assert peer.recv()["t"] == "progress"
    peer.cancel(1)
    assert peer.expect("result") == {"t": "result", "slot": 0, "job_id": 1, "result": None,
                                     "stopped": True}
    assert ("job 1 (echo) stopped early on a cancel; what it returned is dropped (result is "
            "not JSON-serialisable: ") in peer.log()


def test_a_job_that_never_asks_about_the_cancel_finishes_unstopped(start):
    peer = start(handler="worker_handlers:ignores_cancel")
    peer.hello()
    peer.run(1)
    assert peer.recv()["t"] == "progress"
    peer.cancel(1)  # it runs on to the end: a success, whatever the cancel said
    result = peer.expect("result")
    assert result["result"] == "done" and "stopped" not in result


def test_progress_frames_arrive_in_order_before_the_result(start):
    peer = start(handler="worker_handlers:steps")
    peer.hello()
    peer.run(1)
    frames = [peer.recv() for _ in range(5)]
    assert [(f["t"], f.get("fraction"), f.get("message")) for f in frames] == [
        ("progress", 0.25, "step 1"), ("progress", 0.5, "step 2"), ("progress", 0.75, "step 3"),
        ("progress", None, "finishing"), ("result", None, None)]
    assert frames[-1]["result"] == "done"


def test_no_progress_follows_its_jobs_outcome(start):
    # Threads a handler left running may call progress() as the job ends: what they report
    # then goes nowhere, or the supervisor would hear of a job that no longer runs there.
    peer = start(handler="worker_handlers:leaves_progress_threads")
    peer.hello()
    finished = set()
    late = []
    for job_id in range(1, 16):
        peer.run(job_id)
        while (msg := peer.recv())["t"] == "progress":
            if msg["job_id"] in finished:
                late.append(msg["job_id"])
        assert msg == {"t": "result", "slot": 0, "job_id": job_id, "result": "done"}
        finished.add(job_id)
    peer.send({"t": "stop"})
    while True:  # what the last job's threads report until the worker exits
        try:
            msg = peer.recv()
        except EOFError:
            break
        late.append(msg["job_id"])
    assert late == []


def test_stop_cancels_running_jobs_and_exits_0_after_they_return(start):
    peer = start(handler="worker_handlers:until_cancelled", slots=2)
    peer.hello()
    peer.run(1, slot=0)
    peer.run(2, slot=1)
    assert {peer.recv()["job_id"], peer.recv()["job_id"]} == {1, 2}  # both running
    peer.send({"t": "stop"})
    results = {m["job_id"]: m["result"] for m in (peer.expect("result"), peer.expect("result"))}
    assert results == {1: {"cancelled": True}, 2: {"cancelled": True}}
    assert peer.wait_exit() == 0


def test_results_finishing_together_all_arrive_before_a_stop_ends_the_worker(start):
    """Results that finish while another is being written go out in one batch; a stop that
    arrives while that batch is still being written must not end the worker before it is."""
    peer = start(slots=32)
    peer.hello()
    payload = "x" * 100_000  # echoed back: 3 MB of results, far more than the socket holds
    peer.sock.sendall(runs(peer, range(32), payload=payload))
    time.sleep(0.5)  # every handler has returned; the writer waits for the reader
    peer.send({"t": "stop"})
    results = [peer.expect("result") for _ in range(32)]
    assert sorted(m["job_id"] for m in results) == list(range(32))
    assert all(m["result"]["payload"] == payload for m in results)
    assert peer.wait_exit() == 0


def test_sigterm_is_like_stop(start):
    peer = start(handler="worker_handlers:until_cancelled")
    peer.hello()
    peer.run(1)
    assert peer.recv()["t"] == "progress"
    os.kill(peer.pid, signal.SIGTERM)
    assert peer.expect("result")["result"] == {"cancelled": True}
    assert peer.wait_exit() == 0


def test_stop_when_idle_exits_0_at_once(start):
    peer = start()
    peer.hello()
    peer.send({"t": "stop"})
    assert peer.wait_exit() == 0


@pytest.mark.parametrize(("handler", "line"), [
    ("no_such_module_here:run",
     "could not start: cannot import handler 'no_such_module_here:run': ModuleNotFoundError: "
     "No module named 'no_such_module_here'"),
    ("worker_handlers:missing",
     "could not start: cannot import handler 'worker_handlers:missing': module "
     "'worker_handlers' has no attribute 'missing'"),
    ("worker_handlers:NOT_CALLABLE",
     "could not start: handler 'worker_handlers:NOT_CALLABLE' is a int, not a function"),
    ("broken_on_import:handle",
     "could not start: cannot import handler 'broken_on_import:handle': ImportError: the pdf "
     "library is not installed"),
    ("interrupt_on_import:handle",
     "could not start: cannot import handler 'interrupt_on_import:handle': KeyboardInterrupt"),
    ("worker_handlers:generator",
     "could not start: handler 'worker_handlers:generator' is a generator function: it must "
     "return its result (or be an `async def` that returns it)"),
    ("worker_handlers:no_arguments",
     "could not start: handler 'worker_handlers:no_arguments' must take one argument, the job; "
     "its signature is ()"),
    ("lazy_attributes:handle",
     "could not start: cannot import handler 'lazy_attributes:handle': getting 'handle' from "
     "module 'lazy_attributes' raised RuntimeError: the model behind 'handle' could not be "
     "loaded"),
])
def test_handler_import_failure_exits_78_with_one_clear_line(start, handler, line):
    peer = start(handler=handler)
    fatal = peer.recv()
    assert fatal["t"] == "fatal" and fatal["error"] in line
    assert peer.wait_exit() == 78
    last = peer.log().strip().splitlines()[-1]
    assert unstamped(last) == f"fairsched worker w-1 {line}" != last  # and dated, as all are


def test_a_handler_inspect_cannot_describe_still_gets_its_jobs(start):
    peer = start(handler="worker_handlers:no_signature")
    peer.hello()
    peer.run(3)
    assert peer.expect("result")["result"] == {"called": 3}


def test_bad_environment_exits_78_naming_the_variable():
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRSCHED_")}
    done = subprocess.run([sys.executable, "-m", "fairsched.worker"], env=env, timeout=30,
                          capture_output=True, text=True)
    assert done.returncode == 78
    assert unstamped(done.stderr.strip()) == (
        "fairsched worker worker could not start: FAIRSCHED_FD is not set: workers are started "
        "by `fairsched supervise`")


def test_closing_the_supervisor_end_makes_the_worker_exit(start):
    idle = start()
    idle.hello()
    busy = start(handler="worker_handlers:until_cancelled", incarnation="inc-2",
                 name="w-2")
    busy.hello()
    busy.run(1)
    assert busy.recv()["t"] == "progress"
    idle.sock.close()
    busy.sock.close()  # the running handler does not keep its worker alive
    assert idle.wait_exit() == 0
    assert busy.wait_exit() == 0


def test_garbage_from_the_supervisor_makes_the_worker_exit(start):
    peer = start()
    peer.hello()
    peer.sock.sendall(b"\x00\x00\x00\x05hello")
    assert peer.wait_exit() == 76
    assert "bad frame from the supervisor: frame is not valid JSON" in peer.log()


def test_standalone_stdlib_worker_speaks_the_same_protocol(start):
    peer = start(handler=None, command=("python3", str(STANDALONE)), types=("echo", "pdf"))
    assert peer.hello() == {"t": "hello", "protocol": 1, "pid": peer.pid,
                            "incarnation": "inc-1", "slots": 1, "types": ["echo", "pdf"]}
    peer.run(1, job_type="pdf", payload={"x": 1})
    assert peer.recv() == {"t": "progress", "slot": 0, "job_id": 1, "fraction": 0.5,
                           "message": "echoing"}
    assert peer.recv() == {"t": "result", "slot": 0, "job_id": 1,
                           "result": {"echo": {"x": 1}, "pid": peer.pid, "type": "pdf"}}
    peer.run(2, payload={"fail": "no"})
    assert peer.recv() == {"t": "error", "slot": 0, "job_id": 2, "error": "no",
                           "permanent": True}
    peer.run(3, incarnation="old")
    assert peer.recv()["t"] == "refused"
    peer.run(4, job_type="excel")
    assert peer.recv()["reason"] == "type 'excel' unsupported"
    peer.send({"t": "stop"})
    assert peer.wait_exit() == 0


def test_standalone_worker_exits_when_the_supervisor_goes(start):
    peer = start(handler=None, command=("python3", str(STANDALONE)))
    peer.hello()
    peer.sock.close()
    assert peer.wait_exit() == 0


def test_command_runs_in_the_worker_directory(start, tmp_path):
    script = tmp_path / "w.sh"
    script.write_text("#!/bin/sh\npwd > where.txt\n")
    script.chmod(0o755)
    peer = start(handler=None, command=("./w.sh",), cwd=tmp_path)
    assert peer.wait_exit() == 0
    assert (tmp_path / "where.txt").read_text().strip() == str(tmp_path)


def test_launch_errors_name_the_problem(tmp_path):
    with pytest.raises(LaunchError, match="command 'no-such-program-x' not found on PATH"):
        launch(make_spec(tmp_path, handler=None, command=("no-such-program-x",)), "i")
    with pytest.raises(LaunchError, match=re.escape(f"command '{tmp_path}/missing' is not an "
                                                    "executable file")):
        launch(make_spec(tmp_path, handler=None, command=("./missing",), cwd=tmp_path), "i")
    with pytest.raises(LaunchError, match="directory '/nonexistent/dir' does not exist"):
        launch(make_spec(tmp_path, cwd=Path("/nonexistent/dir")), "i")
    with pytest.raises(ValueError, match="exactly one of handler or command"):
        launch(make_spec(tmp_path, command=("true",)), "i")


def test_job_outside_a_worker_reports_nowhere_and_checks_its_arguments():
    job = Job(1, "pdf", {"a": 1})
    job.progress(0.5, "half")  # no connection: nothing to do, no error
    assert not job.cancelled()
    job._cancel()
    assert job.cancelled()
    with pytest.raises(TypeError, match="a number or None, got '50%'"):
        job.progress("50%")
    sent = []
    Job("x", "pdf", slot=2, send=sent.append).progress(1, "all")
    assert sent == [{"t": "progress", "slot": 2, "job_id": "x", "fraction": 1.0,
                     "message": "all"}]
    # Arithmetic never fails a job: a little past the range is clamped, NaN is unknown, and
    # any real number goes.
    reported = Job("x", "pdf", send=sent.append)
    for fraction, shown in [(3 * 0.1 / 0.3, 1.0), (1.5, 1.0), (-1e-17, 0.0),
                            (float("nan"), None), (Fraction(1, 4), 0.25), (1, 1.0),
                            (10**400, 1.0), (-(10**400), 0.0), (Decimal("0.5"), 0.5),
                            (Decimal("1e999"), 1.0), (Decimal("NaN"), None),
                            (Decimal("sNaN"), None)]:
        sent.clear()
        reported.progress(fraction)
        assert sent[0]["fraction"] == shown, (fraction, sent)


@pytest.mark.parametrize("handler", ["close_channel", "replace_channel"])
def test_a_handler_that_breaks_fd_3_ends_its_worker_saying_so(start, handler):
    """Not taken for a supervisor gone (exit 0, the log silent): exit 70, and one line in the
    log that names fd 3."""
    peer = start(handler=f"channel_handlers:{handler}")
    peer.hello()
    peer.run(1)
    assert peer.wait_exit() == 70
    last = peer.log().splitlines()[-1]
    assert "fd 3, the channel to the supervisor, failed" in last and "handler" in last, last


def test_a_handler_that_closes_the_workers_signal_pipe_ends_it_naming_that_pipe(start):
    peer = start(handler="channel_handlers:keep_only_the_channel")
    peer.hello()
    peer.run(1)
    assert peer.wait_exit() == 70
    last = peer.log().splitlines()[-1]
    assert re.search(r"w-1: fd \d+, the pipe that brings the worker its signals, failed: Bad "
                     r"file descriptor \(closed or reused by a handler\?\)$", last), last


def test_a_signal_the_handlers_module_handles_itself_does_not_stop_the_worker(start):
    """Only SIGTERM and SIGINT stop a worker: a signal its handler's module set a handler of
    its own for (SIGUSR2 here, to reload settings, say) reaches that handler, and the worker
    serves on."""
    peer = start(handler="signals_on_import:dispositions")
    peer.hello()
    os.kill(peer.pid, signal.SIGUSR2)
    jobs = itertools.count(1)

    def after_the_signal() -> dict | None:
        """A job's result once the module's handler has seen the signal (jobs run meanwhile
        serve as before)."""
        peer.run(next(jobs))
        result = peer.expect("result")["result"]
        assert result["pid"] == peer.pid and result["usr2"] <= 1, result  # said once
        return result if result["usr2"] else None

    wait_until(after_the_signal, timeout=10, what="the module's SIGUSR2 handler run")
    job = next(jobs)
    peer.run(job)
    assert peer.expect("result")["job_id"] == job
    os.kill(peer.pid, signal.SIGTERM)
    assert peer.wait_exit() == 0


def test_a_handler_holding_a_thousand_files_open_still_gets_its_jobs(start):
    """The worker's own descriptors, opened after the handler's import, are then numbered
    past 1024, which select() cannot watch."""
    peer = start(handler="many_files_on_import:handle")
    peer.hello()
    peer.run(1)
    result = peer.expect("result")["result"]
    assert result["pid"] == peer.pid and result["held"] == 1100, result
    assert result["highest"] > 1024, result  # the case at hand
    os.kill(peer.pid, signal.SIGTERM)  # a signal still reaches the loop
    assert peer.wait_exit() == 0
