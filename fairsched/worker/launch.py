"""Starting worker processes for the supervisor: cold with posix_spawn, or fast from a template.

Which to call: `Template.start(spec)` once per Python handler group, then, once it is ready,
`template.begin_spawn(spec, incarnation)` for every start of that group's processes, the
worker's pid coming back from `template.read_reply()`; when the template fails (it died or
could not import the handler), `launch(spec, incarnation)`, the cold start, which reports any
real problem through the worker itself (exit EXIT_CANNOT_START, one line in its log). Command
workers always use `launch`.

Every process started here (workers and templates) is the caller's child to reap: templates
double-fork, so the caller must have called `become_subreaper()` first. Call these from a
thread that lives as long as the workers (the supervisor's loop thread): Linux delivers the
workers' parent-death signal when the thread that started them exits.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import shutil
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import fairsched
from fairsched.permissions import make_private_folder, open_private
from fairsched.protocol import EXIT_CANNOT_START, PROTOCOL_VERSION
from fairsched.worker._linux import datagram_size, set_child_subreaper

CHANNEL_FD = 3  # the worker's end of its socketpair, in every worker (FAIRSCHED_FD)
READY_TIMEOUT = 60.0  # seconds a template may spend importing its handler
# Seconds a template's control socket may stay full: one that takes no spawn request for
# that long is stuck (in a fork hook of its handler's, say), not busy.
SEND_TIMEOUT = 1.0
# posix_spawn has no cwd argument; a directory gone is a start failure, as in the runtime.
COMMAND_TRAMPOLINE = f'cd -- "$0" || exit {EXIT_CANNOT_START}; exec "$@"'
_RESET_SIGNALS = {signal.SIGPIPE, signal.SIGXFSZ}  # what Python ignores; programs expect default


class LaunchError(OSError):
    """A worker or template could not be started; the message says why in one line."""


class StartsCold(LaunchError):
    """The template imported its handler but will not fork workers from it: they start cold."""


class TemplateGone(LaunchError):
    """The template died (a signal, say) rather than reporting a failure of its own."""


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


def _base_environ(spec: LaunchSpec) -> dict[str, str]:
    env = dict(os.environ)
    env.update(spec.env)
    if spec.handler is not None:  # the worker imports its handler from its cwd (load_handler)
        env = python_environ(env)
    return env


def _check_spec(spec: LaunchSpec) -> None:
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
    _check_spec(spec)
    env = _base_environ(spec)
    env.update(worker_variables(spec, incarnation))
    if spec.handler is not None:
        argv = [sys.executable, "-P", "-m", "fairsched.worker", "--chdir", str(spec.cwd)]
    else:
        program = _resolve_command(spec, env)
        argv = ["/bin/sh", "-c", COMMAND_TRAMPOLINE, str(spec.cwd), program, *spec.command[1:]]
    return _start(argv, env, spec.log_path, socket.SOCK_STREAM)


def start_helper(argv: list[str], env: dict[str, str], log_path: Path) -> Launched:
    """Start one of the supervisor's own helpers (the lease watchdog) the way workers start:
    its own session, the socketpair's other end as fd 3, output appended to `log_path`."""
    return _start(argv, env, log_path, socket.SOCK_STREAM)


def _hand_over(kind: int, log_path: Path, give):
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
    parent, pid = _hand_over(kind, log_path,
                             lambda channel, log_fd: _spawn(argv, env, channel, log_fd))
    return Launched(pid, parent)


def template_log_path(spec: LaunchSpec) -> Path:
    """Where a group's template writes (import warnings, a failed import's traceback)."""
    return Path(spec.log_path).with_name(f"{spec.group}.template.log")


class Template:
    """A pre-loaded process per handler group that forks ready workers on request.

    It imports fairsched.worker.runtime and the handler once; each `begin_spawn` passes the new
    worker's socket end and log over SCM_RIGHTS, and `read_reply` gets back its pid. The template
    double-forks, so with `become_subreaper()` the worker is the caller's child. It exits by
    itself when its control socket closes (`close()`, or the supervisor dying).
    """

    def __init__(self, pid: int, ctrl: socket.socket, spec: LaunchSpec):
        self.pid = pid
        self.group = spec.group
        self.handler = spec.handler
        self.cwd = Path(spec.cwd)
        self.env = dict(spec.env)  # in the template's own environment: its workers inherit it
        self.log_path = template_log_path(spec)
        self._ctrl = ctrl
        self.fd = ctrl.fileno()  # stays the number it had once the socket is closed
        # Called just before the control socket closes, however it comes to (close(), or a
        # failure found on the way): an event loop watching `fd` must stop before the number
        # can be given to another file.
        self.before_close: Callable[[], object] | None = None
        self._ready = False
        self._failure: str | None = None

    @classmethod
    def start(cls, spec: LaunchSpec) -> Template:
        """Start the template for `spec`'s group; returns at once (the import runs meanwhile)."""
        if spec.handler is None:
            raise ValueError(f"worker group {spec.group}: templates serve Python handlers only")
        _check_spec(spec)
        env = _base_environ(spec)
        env.update(worker_variables(spec, ""))
        # Set per worker, by spawn. The template's own log is the supervisor's to rotate.
        for key in ("FAIRSCHED_WORKER", "FAIRSCHED_INCARNATION", "FAIRSCHED_LOG"):
            env.pop(key)
        argv = [sys.executable, "-P", "-m", "fairsched.worker", "--template", "--chdir",
                str(spec.cwd)]
        launched = _start(argv, env, template_log_path(spec), socket.SOCK_SEQPACKET)
        launched.sock.setblocking(True)
        return cls(launched.pid, launched.sock, spec)

    @property
    def closed(self) -> bool:
        return self._ctrl.fileno() < 0

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Block until the handler is imported; LaunchError if the template failed or died."""
        if self._failure is not None:
            raise LaunchError(self._failure)
        if self._ready:
            return
        reply = self._first_reply(timeout)
        if reply.get("cold"):
            self._fail(f"template for {self.group}: {reply.get('error')}", StartsCold)
        if reply.get("ready") is not True:
            self._fail(f"template for {self.group} could not start: "
                       f"{reply.get('error', 'no reason given')}")
        self._ready = True

    def _spawn_request(self, spec: LaunchSpec, incarnation: str) -> bytes:
        """The request that asks the template for a worker; ValueError when spec is not its own."""
        if spec.handler != self.handler or Path(spec.cwd) != self.cwd:
            raise ValueError(f"template for {self.group} runs {self.handler!r} in {self.cwd}, "
                             f"not {spec.handler!r} in {spec.cwd}")
        if dict(spec.env) != self.env:
            raise ValueError(f"template for {self.group} was started with another env than "
                             f"{spec.name}'s")
        if spec.slots < 1 or not spec.types:
            raise ValueError(f"worker {spec.name}: needs at least one slot and one type")
        # The group's env is the template's already: a request carries only what is the
        # worker's own, and so stays small however large that env is.
        env = worker_variables(spec, incarnation)
        return json.dumps({"cwd": str(self.cwd), "env": env}).encode()

    def begin_spawn(self, spec: LaunchSpec, incarnation: str) -> socket.socket:
        """Ask a ready template for a worker without waiting for its answer.

        Returns the supervisor's end of the new worker's socket; the worker's pid comes back
        later, in request order, from `read_reply()` once `fileno()` is readable. Raises
        OSError when the template is not ready, is gone or is stuck (it is killed then).
        """
        request = self._spawn_request(spec, incarnation)
        if self._failure is not None:
            raise LaunchError(self._failure)
        if not self._ready:
            raise LaunchError(f"template for {self.group} is not ready")
        parent, _ = _hand_over(socket.SOCK_STREAM, spec.log_path, functools.partial(
            self._send_spawn_request, request))
        return parent

    def _send_spawn_request(self, request: bytes, channel: int, log_fd: int) -> None:
        try:
            # Never blocking for good: the caller is the supervisor's loop.
            self._ctrl.settimeout(SEND_TIMEOUT)
            socket.send_fds(self._ctrl, [request], [channel, log_fd])
        except TimeoutError:
            self.kill()
            self._fail(f"template for {self.group} took no spawn request for {SEND_TIMEOUT:g} s "
                       "(stuck?); killed it")
        except OSError as exc:
            self._fail(f"template for {self.group} is gone ({exc.strerror or exc})")
        finally:
            if not self.closed:
                self._ctrl.setblocking(False)

    def fileno(self) -> int:
        return self._ctrl.fileno()

    def read_reply(self) -> dict | None:
        """The next spawn answer ({"pid": n} or {"error": ...}); {} when none is waiting yet,
        None when the template is gone (every pending request is lost)."""
        try:
            data = self._ctrl.recv(max(1, datagram_size(self._ctrl)))
        except BlockingIOError:
            return {}
        except OSError:
            data = b""
        if not data:
            self._failure = self._failure or f"template for {self.group} exited"
            return None
        try:
            answer = json.loads(data)
        except ValueError:
            answer = None
        return answer if isinstance(answer, dict) else {"error": "a reply that is not an object"}

    def _first_reply(self, timeout: float) -> dict:
        """The template's answer to its start: ready, or why not."""
        if self.closed:
            raise LaunchError(f"template for {self.group} is closed")
        try:
            self._ctrl.settimeout(timeout)
            reply = self._ctrl.recv(max(1, datagram_size(self._ctrl)))
        except TimeoutError:
            self._fail(f"template for {self.group} did not answer within {timeout:g} s "
                       "while starting")
        except OSError as exc:
            self._fail(f"template for {self.group} is gone ({exc.strerror or exc})",
                       TemplateGone)
        if not reply:
            self._fail(f"template for {self.group} exited while starting "
                       f"(see {self.log_path})", TemplateGone)
        try:
            answer = json.loads(reply)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            self._fail(f"template for {self.group} sent a reply that is not a JSON object")
        return answer

    def _fail(self, reason: str, error: type[LaunchError] = LaunchError) -> NoReturn:
        """Mark the template unusable: every later spawn raises the same LaunchError."""
        self._failure = reason
        self.close()
        raise error(reason)

    def kill(self) -> None:
        """SIGKILL the template (stuck, or importing code that has changed since); the caller
        closes it and reaps `pid`."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def close(self) -> None:
        """Close the control socket; the template then exits. The caller reaps `pid`."""
        if not self.closed and self.before_close is not None:
            self.before_close()
        self._ctrl.close()

    def __repr__(self) -> str:
        return f"Template(group={self.group!r}, pid={self.pid})"

