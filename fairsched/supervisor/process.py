"""One supervised worker process: its assignment, its current incarnation and its crash history.

The assignment (group, types, slots) outlives every incarnation so a replacement comes back the
same; the incarnation (pid, socket, pool slot ids, what befell it) is replaced whole at every
start.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import psutil

from fairsched.config import WorkerSpec
from fairsched.protocol import EXIT_CANNOT_START, EXIT_PROTOCOL, EXIT_SOFTWARE
from fairsched.supervisor.states import ProcessState, check_transition


@dataclass(eq=False)
class Incarnation:
    """One start of a worker process, made whole at spawn and replaced whole at the next: its
    pid, pipe and slots, and what happened to it that tells how it ended."""

    name: str = ""  # "<worker>.<generation>.<token>", as its hello and the frames carry it
    generation: int = 0  # pool worker id: its slots' owner in the slot pool
    pid: int | None = None
    sock: object | None = None
    decoder: object | None = None
    outbox: bytearray = field(default_factory=bytearray)
    writing: bool = False  # a partial write waits for the socket to drain
    slot_ids: list[int] = field(default_factory=list)  # pool slot id per slot index
    types: tuple[str, ...] = ()  # as its hello announced them, of those configured
    started_at: float | None = None  # time.time() of the start
    started_mono: float = 0.0
    oom_kills_at_start: int | None = None  # the kernel's OOM kill count when it started
    jobs_succeeded: int = 0  # one that runs fine after a crash
    active_at: float = 0.0  # monotonic time of its hello, or of its last job's start or end
    jobs_done: int = 0  # jobs it ran to their end, whatever their outcome (max_jobs)
    max_jobs: int | None = None  # its group's max_jobs, drawn within +-10% at its spawn
    recycling: str | None = None  # why it is being replaced (max_jobs, max_rss): its jobs end first
    over_limit: bool = False  # killed for going above rss_limit
    queued_jobs: int = 0  # queued (not on-demand) jobs running on it: the lease watchdog's
    hello_timer: object | None = None
    kill_timer: object | None = None
    signalled: set = field(default_factory=set)  # signals the supervisor sent it
    # Why it was stopped for one of its jobs ("its job timed out", or did not stop when
    # cancelled): the job failed or was cancelled, and the worker is no crash.
    stopped_for_job: str | None = None
    lease_killed: bool = False  # the lease watchdog killed it (watchdog.py)
    fenced_kill: bool = False  # this supervisor killed it under a job of its expiring lease
    write_failed: str | None = None  # why the last write to it failed (it is gone)
    refused_work: bool = False  # stopped for refusing a job: out of step with its config
    leaving: bool = False  # stopped a job unasked: told to stop by someone else (a SIGTERM)
    kill_reason: str | None = None  # why the supervisor killed it, for ps
    # A reload replaces or removes it: its slots take no more work, it stops once its jobs end.
    retiring: bool = False
    said_fatal: str | None = None  # the error of the 'fatal' message it sent
    incompatible: str | None = None  # its hello spoke another protocol version: why
    warned_progress: bool = False  # it was told once that its progress fields are ignored
    warned_stale: bool = False  # told once that messages for jobs not running there are ignored
    warned_log_lost: bool = False  # said once that its log file has no room for its output


@dataclass(eq=False)
class WorkerProcess:
    """One supervised worker: its assignment (spec, index), its state, its crash history, and
    its current incarnation (`life`)."""

    spec: WorkerSpec
    index: int  # 1-based position within its group
    state: ProcessState = ProcessState.DOWN
    life: Incarnation = field(default_factory=Incarnation)
    restarts: int = 0
    crash_times: deque = field(default_factory=deque)
    last_exit: str | None = None
    fatal_reason: str | None = None
    restart_timer: object | None = None
    # Stopped by the autoscaler: not restarted, and left out of `procs` once it has exited.
    scaling_down: bool = False
    removed: bool = False  # a reload took it out of workers.toml: it stops and never comes back

    @property
    def name(self) -> str:
        return f"{self.spec.name}-{self.index}"

    @property
    def group(self) -> str:
        return self.spec.name

    def set_state(self, new: ProcessState) -> None:
        check_transition(self.state, new)
        self.state = new

    def record_crash(self, now: float | None = None) -> int:
        """Remember a crash and return how many fell within the restart window."""
        now = time.monotonic() if now is None else now
        self.crash_times.append(now)
        horizon = now - self.spec.restart_window
        while self.crash_times and self.crash_times[0] < horizon:
            self.crash_times.popleft()
        return len(self.crash_times)

    def crash_loop(self, recent: int) -> bool:
        return recent > self.spec.max_restarts

    def recovered(self, now_mono: float) -> bool:
        """Whether this incarnation has shown that it runs fine: it finished a job well, or
        has been up restart_window seconds (after which a crash before it no longer counts
        toward max_restarts either). How the one before ended is then old news."""
        return (self.state is ProcessState.RUNNING
                and (self.life.jobs_succeeded > 0
                     or now_mono - self.life.started_mono >= self.spec.restart_window))

    def slot_index(self, slot_id: int) -> int | None:
        try:
            return self.life.slot_ids.index(slot_id)
        except ValueError:
            return None


class ExitCause(Enum):
    """Why a worker process ended, as far as what follows goes."""

    SHUTDOWN = "shutdown"  # stopped by the supervisor's shutdown: not restarted
    FENCED = "fenced"  # killed for a lease in doubt (this supervisor, or its watchdog)
    STOPPED_FOR_JOB = "stopped_for_job"  # its job timed out or did not stop when cancelled
    RECYCLED = "recycled"  # replaced after max_jobs or above max_rss: not a crash
    OVER_LIMIT = "over_limit"  # killed above rss_limit: its jobs failed this attempt
    RESTARTED = "restarted"  # the operator's `fairsched restart`
    SCALED_DOWN = "scaled_down"  # stopped by the autoscaler: not restarted
    INCOMPATIBLE = "incompatible"  # it speaks another protocol version: fatal
    CANNOT_START = "cannot_start"  # EXIT_CANNOT_START before its hello: fatal
    CRASHED = "crashed"  # anything else: restarted with backoff, fatal in a crash loop


@dataclass(frozen=True, slots=True)
class Exit:
    cause: ExitCause
    how: str  # in words, for the log and ps: "killed by SIGKILL: out of memory (...)"
    why: str | None = None  # what makes it fatal (INCOMPATIBLE, CANNOT_START)


def decode_exit(proc: WorkerProcess, status: int, *, lease_ran_out: bool, shutting_down: bool,
                last_log_line: Callable[[], str]) -> Exit:
    """How `proc`'s current incarnation ended (its waitpid `status`), decided in this one place
    from what befell it; `lease_ran_out`: the lease watchdog killed it; `last_log_line` reads
    the last line of its log, asked only when that is what explains the exit."""
    life = proc.life
    before_hello = proc.state is ProcessState.STARTING
    # The OOM count is read only for what it can explain: a SIGKILL the supervisor did not send.
    oom_now = (oom_kill_count() if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
               and signal.SIGKILL not in life.signalled else None)
    how = ("killed by the lease watchdog" if lease_ran_out
           else describe_exit(status, life.signalled, (life.oom_kills_at_start, oom_now),
                              started=not before_hello))
    if life.refused_work:
        how += " after refusing work"
    elif life.kill_reason is not None and not lease_ran_out:
        how += f" ({life.kill_reason})"
    elif life.said_fatal is not None and not lease_ran_out:
        if how.endswith(" (could not start)"):
            how = how.removesuffix(")") + f": {life.said_fatal})"
        else:
            how += f" (it said: {life.said_fatal})"
    elif not lease_ran_out and not life.signalled and log_tells_why(status, before_hello):
        # It died saying nothing on the pipe: its log may say why.
        how += (f"{' before its hello' if before_hello else ''} (its log ends: "
                f"{last_log_line()[:300]})")
    if shutting_down:
        return Exit(ExitCause.SHUTDOWN, how)
    if proc.scaling_down:  # idle when it was stopped: however it ended, it was leaving
        return Exit(ExitCause.SCALED_DOWN, how)
    if lease_ran_out or life.fenced_kill:
        return Exit(ExitCause.FENCED, how)
    if life.over_limit:
        return Exit(ExitCause.OVER_LIMIT, how, life.kill_reason)
    if life.stopped_for_job:
        return Exit(ExitCause.STOPPED_FOR_JOB, how, life.stopped_for_job)
    if life.recycling is not None and proc.state is ProcessState.STOPPING:
        return Exit(ExitCause.RECYCLED, how, life.recycling)
    if proc.state is ProcessState.STOPPING and not life.refused_work:
        return Exit(ExitCause.RESTARTED, how)
    if life.incompatible is not None:
        return Exit(ExitCause.INCOMPATIBLE, how, life.incompatible)
    if before_hello and os.WIFEXITED(status) and os.WEXITSTATUS(status) == EXIT_CANNOT_START:
        why = life.said_fatal
        if why is None:
            line = last_log_line()  # the runtime's "... could not start: why"
            why = line.partition(" could not start: ")[2] or line
        return Exit(ExitCause.CANNOT_START, how, why)
    return Exit(ExitCause.CRASHED, how)


def drawn_max_jobs(spec: WorkerSpec) -> int | None:
    """One process's max_jobs: its group's, drawn within +-10% (by one job at least, and never
    below 1), so that the processes of a group started together are not all replaced at
    once."""
    if spec.max_jobs is None:
        return None
    spread = max(1, round(spec.max_jobs / 10))
    return max(1, spec.max_jobs + random.randint(-spread, spread))


def rss_of(pid: int) -> int | None:
    """The resident memory of process `pid`, in bytes; None once it is gone."""
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return None


def describe_exit(status: int, sent: set | frozenset = frozenset(),
                  oom_kills: tuple[int | None, int | None] = (None, None),
                  started: bool = False) -> str:
    """Human words for a waitpid status, e.g. 'killed by SIGKILL: out of memory';
    `sent`: the signals the supervisor itself sent the process; `oom_kills`: the kernel's
    OOM kill count (oom_kill_count) when the process started and now; `started`: it had
    said hello (EXIT_CANNOT_START means "could not start" only before that)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        if sig in sent:
            hint = " from the supervisor"
        elif sig == signal.SIGKILL:
            before, now = oom_kills
            if before is None or now is None:
                hint = ", perhaps out of memory"  # the kernel's OOM killer sends SIGKILL
            elif now > before:
                hint = ": out of memory (the kernel's OOM killer ran while it lived)"
            else:
                hint = " from outside fairsched (not the OOM killer)"
        else:
            hint = ""
        return f"killed by {name}{hint}"
    if os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
        if code == EXIT_CANNOT_START and not started:
            return f"exited with code {code} (could not start)"
        return f"exited with code {code}"
    return f"ended with status {status}"


def log_tells_why(status: int, before_hello: bool) -> bool:
    """Whether the last line of a worker's log is what explains its exit (which the
    supervisor did not cause): a death on its way up, but for a start failure's
    EXIT_CANNOT_START (said in a `fatal` frame), or after its hello, the runtime's own failures
    (EXIT_SOFTWARE, EXIT_PROTOCOL: it wrote why to its log, and could not say it on its pipe)."""
    if not os.WIFEXITED(status):
        return before_hello
    if before_hello:
        return os.WEXITSTATUS(status) != EXIT_CANNOT_START
    return os.WEXITSTATUS(status) in (EXIT_SOFTWARE, EXIT_PROTOCOL)


def oom_kill_count(vmstat: str = "/proc/vmstat") -> int | None:
    """How many processes the kernel's OOM killer has killed since boot (any cgroup's OOM
    too), or None where the kernel does not say."""
    try:
        with open(vmstat, "rb") as f:
            for line in f:
                if line.startswith(b"oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None
