"""One template process as the supervisor sees it: a pre-loaded process per Python handler
group that forks ready workers on request (the process's own side: fairsched.worker.template).

`Template.start(spec)` starts it; once `wait_ready()` has returned, `begin_spawn(spec,
incarnation)` asks for a worker without waiting, and `read_reply()` gives back its pid, in
request order, once `fileno()` is readable. When it fails (it died, or could not import the
handler) the group's workers start cold (fairsched.worker.launch.launch).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from fairsched.worker._linux import datagram_size
from fairsched.worker.launch import (
    LaunchError,
    LaunchSpec,
    base_environ,
    check_spec,
    hand_over,
    start_helper,
    worker_variables,
)

READY_TIMEOUT = 60.0  # seconds a template may spend importing its handler
# Seconds a template's control socket may stay full: one that takes no spawn request for
# that long is stuck (in a fork hook of its handler's, say), not busy.
SEND_TIMEOUT = 1.0


class StartsCold(LaunchError):
    """The template imported its handler but will not fork workers from it: they start cold."""


class TemplateGone(LaunchError):
    """The template died (a signal, say) rather than reporting a failure of its own."""


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
        check_spec(spec)
        env = base_environ(spec)
        env.update(worker_variables(spec, ""))
        # Set per worker, by spawn. The template's own log is the supervisor's to rotate.
        for key in ("FAIRSCHED_WORKER", "FAIRSCHED_INCARNATION", "FAIRSCHED_LOG"):
            env.pop(key)
        argv = [sys.executable, "-P", "-m", "fairsched.worker", "--template", "--chdir",
                str(spec.cwd)]
        launched = start_helper(argv, env, template_log_path(spec), socket.SOCK_SEQPACKET)
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
        parent, _ = hand_over(socket.SOCK_STREAM, spec.log_path, functools.partial(
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

