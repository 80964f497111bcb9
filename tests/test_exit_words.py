"""How a worker's end is put into words: the kernel's OOM kill count tells an out-of-memory
SIGKILL from an operator's `kill -9`."""

import os
import signal
import sys

from fairsched.config import WorkerSpec
from fairsched.protocol import EXIT_CANNOT_START
from fairsched.supervisor.process import (
    Exit,
    ExitCause,
    Incarnation,
    WorkerProcess,
    decode_exit,
    describe_exit,
    oom_kill_count,
)
from fairsched.supervisor.states import ProcessState


def ended_status(code: str, sig: int | None = None) -> int:
    """The raw waitpid status of a real process that runs `code`, killed by `sig` if given."""
    pid = os.posix_spawn(sys.executable, [sys.executable, "-c", code], os.environ)
    if sig is not None:
        os.kill(pid, sig)
    _, status = os.waitpid(pid, 0)
    return status


def killed_status(sig: int) -> int:
    return ended_status("import time; time.sleep(60)", sig)


def test_a_sigkill_is_out_of_memory_only_when_the_oom_count_rose():
    status = killed_status(signal.SIGKILL)
    assert describe_exit(status, oom_kills=(3, 4)) == (
        "killed by SIGKILL: out of memory (the kernel's OOM killer ran while it lived)")
    assert describe_exit(status, oom_kills=(3, 3)) == (
        "killed by SIGKILL from outside fairsched (not the OOM killer)")
    assert describe_exit(status, oom_kills=(None, 3)) == "killed by SIGKILL, perhaps out of memory"
    # The supervisor's own kill says so, whatever the count did meanwhile.
    assert describe_exit(status, {signal.SIGKILL}, (3, 9)) == "killed by SIGKILL from the supervisor"


def test_other_signals_and_exit_codes_ignore_the_oom_count():
    assert describe_exit(killed_status(signal.SIGTERM), oom_kills=(0, 5)) == "killed by SIGTERM"
    status = ended_status("raise SystemExit(3)")
    assert describe_exit(status, oom_kills=(0, 5)) == "exited with code 3"


def test_the_oom_count_is_read_from_vmstat(tmp_path):
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 1\noom_kill 17\nother 2\n")
    assert oom_kill_count(str(vmstat)) == 17
    vmstat.write_text("nr_free_pages 1\n")
    assert oom_kill_count(str(vmstat)) is None
    assert oom_kill_count(str(tmp_path / "missing")) is None
    if os.path.exists("/proc/vmstat"):  # this machine's kernel keeps the count
        assert isinstance(oom_kill_count(), int)


# -- why it ended: one cause, decided in one place (decode_exit) ----------------------------------

def a_worker(state: ProcessState, **befell) -> WorkerProcess:
    """A worker in `state` whose current incarnation went through `befell` (Incarnation's
    fields: kill_reason, said_fatal, stopped_for_job, ...)."""
    spec = WorkerSpec(name="pdf", types=("pdf",), handler="h:run", command=None)
    proc = WorkerProcess(spec, 1, state=state)
    proc.life = Incarnation(name="pdf-1.1.ab", generation=1, **befell)
    return proc


def decoded(proc: WorkerProcess, status: int, *, lease_ran_out=False, shutting_down=False,
            log_line="Traceback: boom"):
    return decode_exit(proc, status, lease_ran_out=lease_ran_out, shutting_down=shutting_down,
                       last_log_line=lambda: log_line)


def test_each_way_a_worker_ends_has_its_cause():
    crashed = ended_status("raise SystemExit(3)")
    cannot_start = ended_status(f"raise SystemExit({EXIT_CANNOT_START})")
    running, starting, stopping = ProcessState.RUNNING, ProcessState.STARTING, ProcessState.STOPPING
    assert decoded(a_worker(running), crashed).cause is ExitCause.CRASHED
    assert decoded(a_worker(running), crashed, shutting_down=True).cause is ExitCause.SHUTDOWN
    assert decoded(a_worker(running), crashed, lease_ran_out=True) == Exit(
        ExitCause.FENCED, "killed by the lease watchdog")
    assert decoded(a_worker(running, fenced_kill=True), crashed).cause is ExitCause.FENCED
    timed_out = decoded(a_worker(stopping, stopped_for_job="its job timed out"), crashed)
    assert (timed_out.cause, timed_out.why) == (ExitCause.STOPPED_FOR_JOB, "its job timed out")
    assert decoded(a_worker(stopping), crashed).cause is ExitCause.RESTARTED
    # A worker stopped for refusing work is out of step: a crash, not an operator's restart.
    refused = decoded(a_worker(stopping, refused_work=True), crashed)
    assert (refused.cause, refused.how) == (ExitCause.CRASHED,
                                            "exited with code 3 after refusing work")
    other = decoded(a_worker(running, incompatible="protocol 9, not 1"), crashed)
    assert (other.cause, other.why) == (ExitCause.INCOMPATIBLE, "protocol 9, not 1")
    said = decoded(a_worker(starting, said_fatal="no module named h"), cannot_start)
    assert said == Exit(ExitCause.CANNOT_START,
                        f"exited with code {EXIT_CANNOT_START} (could not start: no module named h)",
                        "no module named h")
    # Said nothing on its pipe: the runtime's last log line tells why.
    logged = decoded(a_worker(starting), cannot_start,
                     log_line="worker pdf-1 could not start: no module named h")
    assert logged.why == "no module named h"
    # After its hello the same code is a crash like any other.
    assert decoded(a_worker(running), cannot_start).cause is ExitCause.CRASHED


def test_a_crash_says_what_the_supervisor_saw_or_what_the_log_ends_with():
    killed = killed_status(signal.SIGKILL)
    assert decoded(a_worker(ProcessState.RUNNING, kill_reason="no hello within 5 s",
                            signalled={signal.SIGKILL}), killed).how == (
        "killed by SIGKILL from the supervisor (no hello within 5 s)")
    before_hello = decoded(a_worker(ProcessState.STARTING), ended_status("raise SystemExit(1)"),
                           log_line="ImportError: no module named h")
    assert before_hello.how == ("exited with code 1 before its hello (its log ends: "
                                "ImportError: no module named h)")
