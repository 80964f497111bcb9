"""Starting worker processes for the supervisor: cold with posix_spawn (`launch`), and the
helpers every start shares (the worker's environment, its socketpair and log).

A Python handler group's workers are forked from its template when it has a working one
(fairsched.supervisor.template_process); `launch(spec, incarnation)` is the cold start, which
reports any real problem through the worker itself (exit EXIT_CANNOT_START, one line in its
log). Command workers always use `launch`.

Every process started here (workers and templates) is the caller's child to reap: templates
double-fork, so the caller must have called `become_subreaper()` first. Call these from a
thread that lives as long as the workers (the supervisor's loop thread): Linux delivers the
workers' parent-death signal when the thread that started them exits.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

import fairsched
from fairsched.permissions import make_private_folder, open_private
from fairsched.protocol import EXIT_CANNOT_START, PROTOCOL_VERSION
from fairsched.worker._linux import set_child_subreaper

CHANNEL_FD = 3  # the worker's end of its socketpair, in every worker (FAIRSCHED_FD)
# posix_spawn has no cwd argument; a directory gone is a start failure, as in the runtime.
COMMAND_TRAMPOLINE = f'cd -- "$0" || exit {EXIT_CANNOT_START}; exec "$@"'
_RESET_SIGNALS = {signal.SIGPIPE, signal.SIGXFSZ}  # what Python ignores; programs expect default


class LaunchError(OSError):
    """A worker or template could not be started; the message says why in one line."""


@dataclass
class LaunchSpec:
    name: str  # process name, e.g. "pdf-1"
    group: str  # worker group, e.g. "pdf"
    types: tuple[str, ...]
    slots: int
    handler: str | None  # "package.module:function", or None for a command worker
    command: tuple[str, ...] | None
    cwd: Path
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    log_max_bytes: int = 0  # a Python worker rotates its log past this size (0: never)
    log_backups: int = 0
    database_url: str | None = None  # the queue's database, for job.transaction()


@dataclass(frozen=True)
class Launched:
    pid: int
    sock: socket.socket  # the supervisor's end of the socketpair, non-blocking


def become_subreaper() -> bool:
    """Make orphaned descendants (workers forked by templates) children of this process.

    Returns False where the platform has no subreapers (then templates' workers re-parent to
    init and only EOF on their socket ties them to the supervisor).
    """
    return set_child_subreaper()


def worker_variables(spec: LaunchSpec, incarnation: str) -> dict[str, str]:
    """The FAIRSCHED_* variables of one worker start, as docs/protocol.md lists them."""
    env = {
        "FAIRSCHED_FD": str(CHANNEL_FD),
        "FAIRSCHED_PROTOCOL": str(PROTOCOL_VERSION),
        "FAIRSCHED_WORKER": spec.name,
        "FAIRSCHED_GROUP": spec.group,
        "FAIRSCHED_INCARNATION": incarnation,
        "FAIRSCHED_SLOTS": str(spec.slots),
        "FAIRSCHED_TYPES": ",".join(spec.types),
    }
    if spec.handler is not None:
        env["FAIRSCHED_HANDLER"] = spec.handler
        env["FAIRSCHED_LOG"] = str(spec.log_path)
        env["FAIRSCHED_LOG_MAX_BYTES"] = str(spec.log_max_bytes)
        env["FAIRSCHED_LOG_BACKUPS"] = str(spec.log_backups)
        if spec.database_url:
            env["FAIRSCHED_QUEUE_DATABASE"] = spec.database_url
    return env


def python_environ(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (this process's environment by default) for a Python child that must import this
    same fairsched: its folder goes on PYTHONPATH when it runs from a source tree."""
    env = dict(os.environ if env is None else env)
    paths = []
    root = Path(fairsched.__file__).resolve().parent.parent
    if root.name not in ("site-packages", "dist-packages"):
        paths.append(str(root))
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def base_environ(spec: LaunchSpec) -> dict[str, str]:
    env = dict(os.environ)
    env.update(spec.env)
    if spec.handler is not None:  # the worker imports its handler from its cwd (load_handler)
        env = python_environ(env)
    return env


def check_spec(spec: LaunchSpec) -> None:
    if (spec.handler is None) == (spec.command is None):
        raise ValueError(f"worker {spec.name}: needs exactly one of handler or command")
    if spec.slots < 1 or not spec.types:
        raise ValueError(f"worker {spec.name}: needs at least one slot and one type")
    if not Path(spec.cwd).is_dir():
        raise LaunchError(f"directory {str(spec.cwd)!r} does not exist")


def _resolve_command(spec: LaunchSpec, env: dict[str, str]) -> str:
    program = spec.command[0]
    if "/" in program:
        path = Path(spec.cwd, program)  # the config made it absolute; relative: from cwd
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise LaunchError(f"command {str(path)!r} is not an "
                              f"executable file")
        return str(path.resolve())
    found = shutil.which(program, path=env.get("PATH", os.defpath))
    if found is None:
        raise LaunchError(f"command {program!r} not found on PATH")
    return found


def _open_log(path: Path) -> int:
    """The log opened to append, private to this account. Never blocking: a FIFO in its place
    with no reader is ENXIO, not a supervisor waiting for one; the descriptor itself blocks
    as usual."""
    path = Path(path)
    # Missing (removed while the supervisor ran): made again, private. One that is there is
    # the caller's to set up: this may be a folder outside any state_dir.
    make_private_folder(path.parent, tighten=False)
    fd = open_private(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
    os.set_blocking(fd, True)
    return fd


def _spawn(argv: list[str], env: dict[str, str], channel: int, log_fd: int) -> int:
    """posix_spawn `argv` in its own session: stdin /dev/null, stdout+stderr to the log,
    `channel` as fd 3. Every other descriptor of ours is close-on-exec."""
    devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    moved = []
    try:
        # A source at 0..3 would be overwritten by an earlier dup2 (a supervisor started with
        # stdin closed gets fd 0 for its first file): lift those out of the way first.
        sources = []
        for fd in (devnull, log_fd, channel):
            if fd <= CHANNEL_FD:
                fd = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
                moved.append(fd)
            sources.append(fd)
        devnull_src, log_src, channel_src = sources
        actions = [
            (os.POSIX_SPAWN_DUP2, devnull_src, 0),
            (os.POSIX_SPAWN_DUP2, log_src, 1),
            (os.POSIX_SPAWN_DUP2, log_src, 2),
            (os.POSIX_SPAWN_DUP2, channel_src, CHANNEL_FD),
        ]
        return os.posix_spawn(argv[0], argv, env, file_actions=actions, setsid=True,
                              setsigmask=(), setsigdef=_RESET_SIGNALS)
    finally:
        os.close(devnull)
        for fd in moved:
            os.close(fd)


def launch(spec: LaunchSpec, incarnation: str) -> Launched:
    """Cold start: a fresh `python -m fairsched.worker` (or the command) for `incarnation`."""
    check_spec(spec)
    env = base_environ(spec)
    env.update(worker_variables(spec, incarnation))
    if spec.handler is not None:
        argv = [sys.executable, "-P", "-m", "fairsched.worker", "--chdir", str(spec.cwd)]
    else:
        program = _resolve_command(spec, env)
        argv = ["/bin/sh", "-c", COMMAND_TRAMPOLINE, str(spec.cwd), program, *spec.command[1:]]
    return _start(argv, env, spec.log_path, socket.SOCK_STREAM)


def start_helper(argv: list[str], env: dict[str, str], log_path: Path,
                 kind: int = socket.SOCK_STREAM) -> Launched:
    """Start one of the supervisor's own processes (the lease watchdog, a template) the way
    workers start: its own session, the socketpair's other end (of `kind`) as fd 3, output
    appended to `log_path`."""
    return _start(argv, env, log_path, kind)


def hand_over(kind: int, log_path: Path, give):
    """Make the worker's socketpair and open its log; `give(child_fd, log_fd)` passes both on.

    Returns (the supervisor's non-blocking end, what `give` returned). Our copies of the
    worker's end and of the log are closed either way, so only the worker holds them.
    """
    parent, child = socket.socketpair(socket.AF_UNIX, kind)
    try:
        log_fd = _open_log(log_path)
        try:
            result = give(child.fileno(), log_fd)
        finally:
            os.close(log_fd)
    except BaseException:
        parent.close()
        raise
    finally:
        child.close()
    parent.setblocking(False)
    return parent, result


def _start(argv, env, log_path: Path, kind: int) -> Launched:
    parent, pid = hand_over(kind, log_path,
                             lambda channel, log_fd: _spawn(argv, env, channel, log_fd))
    return Launched(pid, parent)
