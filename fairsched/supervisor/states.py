"""Worker process states and the transitions allowed between them, in one place; the
signals the supervisor handles."""

import signal
from enum import StrEnum

# Signals the supervisor stops on, reloads workers.toml on, and logs and ignores; until its
# loop takes them over they are noted and acted on then (main.run_supervisor).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
RELOAD_SIGNALS = (signal.SIGHUP,)
IGNORED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


class ProcessState(StrEnum):
    STARTING = "starting"  # spawned, hello not yet received
    RUNNING = "running"  # hello received, slots registered
    STOPPING = "stopping"  # asked to stop (restart or shutdown); slots no longer take work
    DOWN = "down"  # exited; waiting out its restart backoff
    FATAL = "fatal"  # crashed too often or cannot start; left down until `fairsched restart`
    STOPPED = "stopped"  # exited during shutdown; will not come back


TRANSITIONS: dict[ProcessState, frozenset[ProcessState]] = {
    ProcessState.STARTING: frozenset({ProcessState.RUNNING, ProcessState.STOPPING,
                                      ProcessState.DOWN, ProcessState.FATAL, ProcessState.STOPPED}),
    ProcessState.RUNNING: frozenset({ProcessState.STOPPING, ProcessState.DOWN,
                                     ProcessState.FATAL, ProcessState.STOPPED}),
    ProcessState.STOPPING: frozenset({ProcessState.DOWN, ProcessState.STOPPED,
                                      ProcessState.STARTING, ProcessState.FATAL}),
    ProcessState.DOWN: frozenset({ProcessState.STARTING, ProcessState.STOPPED, ProcessState.FATAL}),
    ProcessState.FATAL: frozenset({ProcessState.STARTING, ProcessState.STOPPED,
                                   ProcessState.DOWN}),  # restarted, its template importing
    ProcessState.STOPPED: frozenset({ProcessState.STARTING}),
}

# States in which no process of the worker lives: it exited (or never started).
EXITED = frozenset({ProcessState.DOWN, ProcessState.FATAL, ProcessState.STOPPED})

# How a process state shows on each of its slots in `fairsched ps` (busy/free come from the pool).
SLOT_STATE = {
    ProcessState.STARTING: "starting",
    ProcessState.RUNNING: "stopping",  # running without slots: its pipe closed, it goes next
    ProcessState.STOPPING: "stopping",
    ProcessState.DOWN: "down",
    ProcessState.FATAL: "fatal",
    ProcessState.STOPPED: "down",
}


class TransitionError(RuntimeError):
    pass


def check_transition(old: ProcessState, new: ProcessState) -> None:
    if new is not old and new not in TRANSITIONS[old]:
        raise TransitionError(f"process state cannot go from {old.value} to {new.value}")
