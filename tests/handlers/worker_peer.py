"""The supervisor's side of the pipe, for tests that drive real workers without a supervisor."""

from __future__ import annotations

import os
import select
import signal
import time
from collections import deque
from pathlib import Path

from fairsched.protocol import WORKER_MESSAGES, FrameDecoder, encode, validate
from fairsched.supervisor.template_process import Template
from fairsched.worker.launch import Launched, LaunchError, LaunchSpec

HERE = Path(__file__).parent
TIMEOUT = 10.0


def make_spec(log_dir: Path, name: str = "w-1", handler: str | None = "worker_handlers:echo",
              types=("echo",), slots: int = 1, command=None, env=None, cwd: Path = HERE):
    return LaunchSpec(name=name, group=name.rpartition("-")[0] or name, types=tuple(types),
                      slots=slots, handler=handler, command=command, cwd=cwd,
                      log_path=log_dir / f"{name}.log", env=dict(env or {}))


def spawn(template: Template, spec: LaunchSpec, incarnation: str) -> Launched:
    """A worker forked by `template` the way the supervisor asks for one: the template ready,
    the request sent without waiting (begin_spawn), the pid read once the answer is there."""
    template.wait_ready()
    sock = template.begin_spawn(spec, incarnation)
    try:
        if not select.select([template.fileno()], [], [], TIMEOUT)[0]:
            raise AssertionError(f"template {template.pid} did not answer within {TIMEOUT} s")
        reply = template.read_reply()
        if reply is None:
            raise LaunchError(f"template for {template.group} exited")
        if not isinstance(reply.get("pid"), int):
            raise LaunchError(f"template for {template.group} could not start {spec.name}: "
                              f"{reply.get('error')}")
    except BaseException:
        sock.close()
        raise
    return Launched(reply["pid"], sock)


class Peer:
    """One worker process: send frames, receive validated messages, wait for its exit."""

    def __init__(self, launched: Launched, incarnation: str, spec: LaunchSpec, child=True):
        self.pid = launched.pid
        self.sock = launched.sock
        self.sock.settimeout(TIMEOUT)
        self.incarnation = incarnation
        self.spec = spec
        self.child = child  # False for template-forked workers outside a subreaper
        self.decoder = FrameDecoder(WORKER_MESSAGES)
        self.inbox: deque[dict] = deque()
        self.status: int | None = None

    def send(self, msg: dict) -> None:
        self.sock.sendall(encode(msg))

    def run(self, job_id, job_type="echo", payload=None, slot=0, incarnation=None,
            priority=0, attempt=1, on_demand=False) -> None:
        self.send({"t": "run", "incarnation": self.incarnation if incarnation is None
                   else incarnation, "slot": slot,
                   "job": {"id": job_id, "type": job_type, "payload": payload,
                           "priority": priority, "attempt": attempt, "on_demand": on_demand}})

    def cancel(self, job_id, slot=0) -> None:
        self.send({"t": "cancel", "incarnation": self.incarnation, "slot": slot,
                   "job_id": job_id})

    def recv(self) -> dict:
        while not self.inbox:
            data = self.sock.recv(1 << 16)
            if not data:
                raise EOFError(f"worker {self.pid} closed its socket")
            self.inbox.extend(validate(m) for m in self.decoder.feed(data))
        return self.inbox.popleft()

    def expect(self, kind: str) -> dict:
        """The next message that is not progress, checked to be `kind`."""
        msg = self.recv()
        while msg["t"] == "progress" and kind != "progress":
            msg = self.recv()
        assert msg["t"] == kind, msg
        return msg

    def hello(self) -> dict:
        msg = self.recv()
        assert msg["t"] == "hello", msg
        return msg

    def log(self) -> str:
        try:
            return self.spec.log_path.read_text()
        except FileNotFoundError:
            return ""

    def wait_exit(self, timeout: float = TIMEOUT) -> int | None:
        """The exit code (child) or None (not our child) once the process is gone."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.child:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.status = status
                    return os.waitstatus_to_exitcode(status)
            elif not _alive(self.pid):
                return None
            time.sleep(0.005)
        raise AssertionError(f"worker {self.pid} still running after {timeout} s;\n{self.log()}")

    def cleanup(self) -> None:
        self.sock.close()
        if self.status is not None:
            return
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        except PermissionError:  # the group is gone and the pid reused: leave it alone
            return
        if self.child:
            os.waitpid(self.pid, 0)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
