"""The template process: imports a handler once, then forks ready workers on request.

Started by the supervisor's Template (fairsched.supervisor.template_process) with its control
socket (SOCK_SEQPACKET) on fd 3. It answers {"ready": true} (or {"error": ...} and exit
EXIT_CANNOT_START), then serves requests, one datagram each: JSON {"cwd", "env"} (the worker's
FAIRSCHED_* variables; the group's env is the template's own) with two descriptors attached
(the worker's socket end, its log file), answered with {"pid": N} or {"error": ...}. EOF on
the control socket ends the template.

The workers share the handler's imported modules with the template, page for page, until
they write to them. The garbage collector would: each collection updates a field in every
object it tracks. So the template freezes what it holds before forking (gc.freeze, as the
gc module's documentation advises for fork without exec), and the workers' collections pass
those objects by. (Reading an object still writes its reference count: the pages of what a
job touches are copied all the same.)
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import NoReturn

from fairsched.protocol import EXIT_CANNOT_START, EXIT_SOFTWARE
from fairsched.worker._linux import datagram_size, set_title
from fairsched.worker.handler import Handler, StartupError, describe_exception, load_handler
from fairsched.worker.log_streams import install as install_log_streams
from fairsched.worker.orphan import fork_orphan
from fairsched.worker.runtime import (
    _die_with_parent,
    cannot_start,
    exit_now,
    open_channel,
    serve,
    settings_from_environ,
)

CONTROL_FD = 3
# Characters of an error a reply carries: escaped as JSON it still fits in one datagram (the
# socket's send buffer, about 200 KiB, bounds it); the template's log has all of it.
REPLY_ERROR = 8192


def main(args: list[str]) -> NoReturn:
    """`python -m fairsched.worker --template [--chdir DIR]`."""
    group = os.environ.get("FAIRSCHED_GROUP") or "?"
    ctrl = None
    install_log_streams()  # before the handler's import, which may print
    try:
        if args[:1] == ["--chdir"] and len(args) == 2:
            os.chdir(args[1])
        elif args:
            raise StartupError(f"unexpected template arguments {' '.join(args)!r}")
        ctrl = socket.socket(fileno=CONTROL_FD)
        ctrl.setblocking(True)
        supervisor = os.getppid()
        _die_with_parent()
        gc.disable()  # no collection leaves holes among the objects the workers will share
        handler = load_handler(os.environ.get("FAIRSCHED_HANDLER"))
        if threading.active_count() > 1:
            # A fork carries over the calling thread alone: a worker forked now would find
            # the module's threads gone, and any lock one of them held locked for good.
            _reply(ctrl, {"cold": True, "error": (
                f"importing {os.environ.get('FAIRSCHED_HANDLER')} started "
                f"{threading.active_count() - 1} thread(s), which a forked worker would not "
                "have: its workers start cold, each importing it itself")})
            exit_now(0)
    except (StartupError, OSError) as exc:
        print(f"fairsched template for {group} could not start: {exc}", file=sys.stderr)
        if ctrl is not None:
            _reply(ctrl, {"error": str(exc)})
        exit_now(EXIT_CANNOT_START)
    set_title(f"fairsched: template {group} ({os.environ.get('FAIRSCHED_HANDLER')}, supervisor "
              f"{supervisor})")
    _reply(ctrl, {"ready": True})
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(ctrl, max(1, datagram_size(ctrl)), 4)
        except OSError:
            data, fds = b"", []
        if not data:  # the supervisor closed us or is gone
            for fd in fds:
                os.close(fd)
            exit_now(0)
        try:
            answer = {"pid": fork_worker(json.loads(data), fds, handler, ctrl, supervisor)}
        except Exception as exc:
            print(f"fairsched template for {group}: spawn failed: {describe_exception(exc)}",
                  file=sys.stderr)
            answer = {"error": describe_exception(exc)}
        finally:
            for fd in fds:
                os.close(fd)
        _reply(ctrl, answer)


def _reply(ctrl: socket.socket, answer: dict) -> None:
    if len(answer.get("error", "")) > REPLY_ERROR:
        answer = {**answer, "error": answer["error"][:REPLY_ERROR] + " ..."}
    try:
        ctrl.send(json.dumps(answer).encode())
    except OSError:
        exit_now(0)


def fork_worker(request: dict, fds: list[int], handler: Handler, ctrl: socket.socket,
                supervisor: int) -> int:
    """Fork a worker through an intermediate that exits at once (fork_orphan), so the worker
    re-parents to the nearest subreaper: the supervisor. Returns its pid."""
    if len(fds) != 2:
        raise ValueError(f"a spawn request carries 2 descriptors, this one {len(fds)}")
    if not isinstance(request, dict) or not isinstance(request.get("env"), dict):
        raise ValueError("a spawn request is a JSON object with 'cwd' and 'env'")
    for stream in (sys.stdout, sys.stderr):  # or the children would write our buffers again
        try:
            stream.flush()
        except Exception:  # the handler's import put in its place what cannot flush (or
            pass           # closed it): nothing of ours is buffered there
    gc.freeze()  # see the module's docstring; the worker turns collection back on
    worker, intermediate = fork_orphan()
    if worker == 0:
        try:
            become_worker(request, fds, handler, ctrl, supervisor, intermediate)
        except BaseException:  # the worker never returns into the template's loop
            traceback.print_exc()
        os._exit(EXIT_SOFTWARE)
    return worker


def become_worker(request: dict, fds: list[int], handler: Handler, ctrl: socket.socket,
                  supervisor: int, intermediate: int) -> NoReturn:
    """In the forked worker: shed the template's state, take fd 3 and the log, then serve."""
    name = request["env"].get("FAIRSCHED_WORKER", "worker")
    gc.enable()
    try:
        # Signal dispositions stay as the handler's import left them (a stack dump on
        # SIGUSR1, SIGHUP ignored): a cold worker imports it and has them too.
        signal.set_wakeup_fd(-1)
        os.setsid()
        ctrl.close()  # frees fd 3; the received descriptors are above it
        channel, log_fd = fds
        os.dup2(channel, 3)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        for fd in (channel, log_fd):
            if fd > 3:
                os.close(fd)
        os.environ.update({str(k): str(v) for k, v in request["env"].items()})
        try:
            os.chdir(request["cwd"])
        except OSError as exc:  # removed since the template started: as a cold start says it
            raise StartupError(f"cannot enter worker directory {request['cwd']!r}: "
                               f"{exc.strerror}") from None
        # The parent-death signal fires when the parent changes too, so it is set only once
        # the intermediate is gone and the supervisor (a subreaper) has adopted this process.
        while os.getppid() == intermediate:
            time.sleep(0.0001)
        if os.getppid() == supervisor:
            _die_with_parent()
            if os.getppid() != supervisor:  # the supervisor died in between
                exit_now(0)
        settings = settings_from_environ(os.environ)
        sock = open_channel(settings.fd)
    except StartupError as exc:
        cannot_start(name, exc, None)
    except BaseException:
        traceback.print_exc()
        exit_now(EXIT_SOFTWARE)
    serve(settings, handler, sock)
