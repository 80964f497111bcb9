"""The Python worker runtime: says hello on fd 3, then runs the handler for each job it is sent.

The main thread reads frames (and signals, through a wakeup pipe); each job runs on a thread of
its own while it runs (at most one thread per slot, kept between jobs); every frame goes out
under one write lock. docs/protocol.md is the contract this side keeps.
"""

from __future__ import annotations

import collections
import errno
import functools
import os
import select
import signal
import socket
import stat
import sys
import threading
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NoReturn

from fairsched.job import Job
from fairsched.protocol import (
    EXIT_CANNOT_START,
    EXIT_PROTOCOL,
    EXIT_SOFTWARE,
    PROTOCOL_VERSION,
    READ_SIZE,
    SUPERVISOR_MESSAGES,
    FrameDecoder,
    ProtocolError,
    encode,
    validate,
)
from fairsched.worker._linux import set_parent_death_signal, set_title
from fairsched.worker.handler import (
    MAX_ERROR,
    Handler,
    StartupError,
    answer,
    keep_log,
    load_handler,
    note,
    restore_streams,
)
from fairsched.worker.log_streams import install as install_log_streams
from fairsched.worker.log_streams import tell_lost

_STOP_SIGNALS = frozenset((signal.SIGTERM, signal.SIGINT))  # what stops a worker; see serve()


@dataclass(frozen=True)
class Settings:
    fd: int
    name: str
    group: str
    incarnation: str
    slots: int
    types: tuple[str, ...]
    handler: str | None
    database_url: str | None = None  # FAIRSCHED_QUEUE_DATABASE, for job.transaction()


def settings_from_environ(environ: Mapping[str, str]) -> Settings:
    """The FAIRSCHED_* variables the supervisor sets, checked; StartupError names the bad one."""

    def need(key: str) -> str:
        value = environ.get(key)
        if not value:
            raise StartupError(f"{key} is not set: workers are started by `fairsched supervise`")
        return value

    protocol = environ.get("FAIRSCHED_PROTOCOL", str(PROTOCOL_VERSION))
    if protocol != str(PROTOCOL_VERSION):
        raise StartupError(f"FAIRSCHED_PROTOCOL={protocol!r}: this worker speaks protocol "
                           f"{PROTOCOL_VERSION}")
    fd_text = need("FAIRSCHED_FD")
    if not fd_text.isdigit():
        raise StartupError(f"FAIRSCHED_FD must be a file descriptor number, got {fd_text!r}")
    slots_text = need("FAIRSCHED_SLOTS")
    if not slots_text.isdigit() or int(slots_text) < 1:
        raise StartupError(f"FAIRSCHED_SLOTS must be an integer >= 1, got {slots_text!r}")
    types = tuple(t for t in need("FAIRSCHED_TYPES").split(",") if t)
    if not types:
        raise StartupError("FAIRSCHED_TYPES names no job type")
    name = need("FAIRSCHED_WORKER")
    return Settings(fd=int(fd_text), name=name,
                    group=environ.get("FAIRSCHED_GROUP") or name.rpartition("-")[0] or name,
                    incarnation=need("FAIRSCHED_INCARNATION"), slots=int(slots_text),
                    types=types, handler=environ.get("FAIRSCHED_HANDLER") or None,
                    database_url=environ.get("FAIRSCHED_QUEUE_DATABASE") or None)


def open_channel(fd: int) -> socket.socket:
    """The worker's end of the supervisor's socketpair, in blocking mode."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        raise StartupError(f"FAIRSCHED_FD={fd} is not an open file descriptor") from None
    if not stat.S_ISSOCK(mode):
        raise StartupError(f"FAIRSCHED_FD={fd} is not a socket")
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    return sock


def exit_now(code: int) -> NoReturn:
    """Leave at once (no atexit, no thread joins), after flushing what the log still buffers."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def cannot_start(name: str, exc: StartupError, sock: socket.socket | None) -> NoReturn:
    """Report a start failure: one line in the log, a "fatal" frame if possible, exit
    EXIT_CANNOT_START."""
    print(f"fairsched worker {name} could not start: {exc}", file=sys.stderr)
    if sock is not None:
        try:
            sock.sendall(encode({"t": "fatal", "error": str(exc)[:MAX_ERROR]}))
        except OSError:
            pass
    exit_now(EXIT_CANNOT_START)


class Worker:
    """Serves run/cancel/stop for one incarnation until stopped or orphaned."""

    def __init__(self, sock: socket.socket, settings: Settings, handler: Handler):
        self.sock = sock
        self.settings = settings
        self.handler = handler
        self.pid = os.getpid()
        self.jobs: list[Job | None] = [None] * settings.slots
        # Jobs read but not yet started. One thread at a time is called for them (woken or
        # started), and a thread that takes one calls the next: a burst of long jobs still
        # starts them all, while a burst of short ones runs on the few threads that finish
        # first, with few thread switches. There are never more threads than slots.
        self._ready: collections.deque[Job] = collections.deque()
        self._threads = 0
        # The idle threads, each blocked on a lock of its own: releasing it wakes that thread.
        self._idle: list[threading.Lock] = []
        self._coming = 0  # 1 while a thread is woken or just started, else 0
        self._returning = 0  # threads that finished a job and will look for the next
        self.stopping = False
        self._write_lock = threading.Lock()
        # Held while a slot changes hands, so a finished job's result and its slot's release
        # are one step: the next "run" for that slot can only be read after both.
        self._state_lock = threading.Lock()
        self._failing = threading.Lock()  # held by the thread that reports fd 3 failed
        # Results that finish while another thread is writing wait here and go out together
        # in its next write: one system call (and one wakeup of the supervisor) per burst.
        self._results: list[bytes] = []
        self._flushing = False
        self._log = keep_log()
        # Each slot's connection to the queue's database, opened by its first job.transaction()
        # and kept: a slot runs one job at a time, so no two transactions share one.
        self._connections: list = [None] * settings.slots

    # -- output ---------------------------------------------------------------------------------

    def send_frame(self, data: bytes, job: Job | None = None) -> None:
        """Write a frame under the write lock; with `job`, only while its outcome is not on
        its way (a progress from a thread the handler left running must not follow it)."""
        with self._write_lock:
            if job is not None and job._done:
                return
            try:
                self.sock.sendall(data)
            except OSError as exc:
                self.channel_failed(exc)

    def channel_failed(self, exc: OSError, what: str | None = None) -> NoReturn:
        """fd 3 failed (or `what`, another descriptor the loop needs). EPIPE or ECONNRESET:
        the supervisor is gone, and so is this worker. Anything else (EBADF, ENOTSOCK) is no
        news of the supervisor: a handler closed fd 3, or gave its number to a file of its
        own; the worker cannot go on, and says why."""
        # The loop and a job's thread can both find it at once: the first says it and exits
        # the process, the other waits for that (two lines written together would mix).
        if not self._failing.acquire(blocking=False):
            self._failing.acquire()
        if exc.errno in (errno.EPIPE, errno.ECONNRESET):
            exit_now(0)
        what = what or f"fd {self.settings.fd}, the channel to the supervisor"
        note(f"fairsched worker {self.settings.name}: {what}, failed: {exc.strerror or exc} "
             "(closed or reused by a handler?)")
        exit_now(EXIT_SOFTWARE)

    def send(self, msg: dict) -> None:
        self.send_frame(encode(msg))

    def send_for_job(self, job: Job, msg: dict) -> None:
        """What a job's progress() sends through. A process the handler forked is not the
        worker: what it reports would mix into the worker's frames, and a write lock another
        thread held at the fork stays held in it for good, so it reports nothing. Nor does a
        thread the handler left running once the job's outcome is on its way: asked under the
        write lock, which that outcome needs too, so no progress follows it out."""
        if os.getpid() == self.pid:
            self.send_frame(encode(msg), job)

    # -- the loop -------------------------------------------------------------------------------

    def serve(self) -> NoReturn:
        """Say hello, then read frames until "stop" completes or the supervisor goes away."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        own = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        for sig in _STOP_SIGNALS:
            signal.signal(sig, _ignore_signal)  # the wakeup pipe carries it to the loop
        os.register_at_fork(after_in_child=functools.partial(_forked_by_a_handler, own))
        s = self.settings
        self.send({"t": "hello", "protocol": PROTOCOL_VERSION, "pid": os.getpid(),
                   "incarnation": s.incarnation, "slots": s.slots, "types": list(s.types)})
        decoder = FrameDecoder(SUPERVISOR_MESSAGES)
        fd = self.sock.fileno()
        buffer = memoryview(bytearray(READ_SIZE))  # reused: no large allocation per read
        # poll, not select: a handler that holds a thousand files open from its import has
        # the wakeup pipe numbered past what select() can watch.
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.register(wake_r, select.POLLIN)
        while True:
            ready = [ready_fd for ready_fd, _ in poller.poll()]
            # The wakeup pipe carries every signal with a Python handler, the handler
            # module's own ones too (a reload on SIGHUP, say): only these two stop the worker.
            if wake_r in ready:
                try:
                    signals = os.read(wake_r, 512)
                except OSError as exc:  # EBADF: a handler closed it
                    self.channel_failed(exc, f"fd {wake_r}, the pipe that brings the worker "
                                             "its signals")
                if _STOP_SIGNALS.intersection(signals):
                    self.stop()
            if fd not in ready:
                continue
            try:
                size = self.sock.recv_into(buffer)
            except OSError as exc:
                self.channel_failed(exc)
            if not size:  # the supervisor is gone: leave before anything else happens
                exit_now(0)
            try:
                for msg in decoder.feed(buffer[:size]):
                    self.handle(validate(msg))
            except ProtocolError as exc:
                note(f"fairsched worker {s.name}: bad frame from the supervisor: {exc}")
                exit_now(EXIT_PROTOCOL)

    def handle(self, msg: dict) -> None:
        kind = msg["t"]
        if kind == "run":
            self.start_job(msg)
        elif kind == "cancel":
            self.cancel_job(msg)
        else:
            self.stop()

    def start_job(self, msg: dict) -> None:
        spec = msg["job"]
        slot = msg["slot"]
        with self._state_lock:
            reason = self._refusal(msg["incarnation"], slot, spec["type"])
            if reason is not None:
                self.send({"t": "refused", "slot": slot, "job_id": spec["id"], "reason": reason})
                return
            job = Job(spec["id"], spec["type"], spec["payload"], spec["priority"],
                      spec["attempt"], spec["on_demand"], slot=slot,
                      claim=spec.get("claim", 0),
                      connection=None if self.settings.database_url is None else
                      functools.partial(self.connection, slot))
            job._send = functools.partial(self.send_for_job, job)
            self.jobs[slot] = job
            self._ready.append(job)
            call = self._call_thread()
        if call is not None:
            call()

    def connection(self, slot: int):
        """The slot's connection to the queue's database (job.transaction()): opened on first
        use, again if the last one broke, else the same one. Not in a process a handler forked:
        the worker's connection is not its own to use, nor its success to record."""
        if os.getpid() != self.pid:
            raise RuntimeError("job.transaction() works in the worker, not in a process its "
                               "handler forked")
        conn = self._connections[slot]
        if conn is None or conn.closed or conn.broken:
            from fairsched.store.database import connect  # psycopg only where it is used

            conn = self._connections[slot] = connect(self.settings.database_url,
                                                     autocommit=True)
        return conn

    def _call_thread(self) -> Callable[[], None] | None:
        """Under the state lock: make sure a thread is on its way while jobs are ready. Returns
        what wakes or starts it, for the caller to call once it has let go of the lock (the
        thread's first step is to take it)."""
        if not self._ready or self._coming or self._returning:
            return None
        self._coming = 1
        if self._idle:
            return self._idle.pop().release  # the thread idle the shortest time
        self._threads += 1
        return threading.Thread(target=self._serve, daemon=True, name=f"job-{self._threads}").start

    def _serve(self) -> None:
        """One job thread: run ready jobs until there are none, then wait for more.

        While jobs are ready a thread is coming for them (woken, just started, or back from
        its last job), and each thread that takes one calls the next, so no job waits behind
        a long one. A thread that is free sooner may take the job first; the one that was
        coming then finds nothing and waits again. A thread is started only when none is
        idle or on its way back, so there are never more threads than slots.
        """
        wake = threading.Lock()
        wake.acquire()
        state = self._state_lock
        state.acquire()
        self._coming -= 1
        while True:
            if not self._ready:
                self._idle.append(wake)
                state.release()
                wake.acquire()  # until _call_thread's caller releases it
                state.acquire()
                self._coming -= 1
                continue
            job = self._ready.popleft()
            call = self._call_thread()  # the next ready job must not wait for this one
            state.release()
            if call is not None:
                call()
            try:
                data = tell_lost(answer(self.handler, job))
                if os.getpid() != self.pid:  # a handler's fork came back here: it is not the
                    exit_now(0)              # worker, and must not speak for it
                self.finish_job(job, data)
            finally:
                state.acquire()
            self._returning -= 1

    def _refusal(self, incarnation: str, slot: int, job_type: str) -> str | None:
        s = self.settings
        if incarnation != s.incarnation:
            return f"work for incarnation {incarnation!r}, this worker is {s.incarnation!r}"
        if self.stopping:
            return "the worker is stopping"
        if slot >= s.slots:
            return f"slot {slot} is out of range: this worker has slots 0..{s.slots - 1}"
        busy = self.jobs[slot]
        if busy is not None:
            return f"slot {slot} is busy with job {busy.id!r}"
        if job_type not in s.types:
            return f"type {job_type!r} is not handled here (handles {', '.join(s.types)})"
        return None

    def cancel_job(self, msg: dict) -> None:
        if msg["incarnation"] != self.settings.incarnation:
            return
        with self._state_lock:
            slot = msg["slot"]
            job = self.jobs[slot] if slot < len(self.jobs) else None
            # A cancel that crossed the job's result on the wire finds nothing: not an error.
            if job is not None and job.id == msg["job_id"]:
                job._cancel()

    def stop(self) -> None:
        """Cancel everything running; exit 0 once the handlers have returned."""
        with self._state_lock:
            self.stopping = True
            running = [job for job in self.jobs if job is not None]
            for job in running:
                job._cancel()
            writing = self._flushing  # that thread exits once the last results are out
        if not running and not writing:
            exit_now(0)

    def finish_job(self, job: Job, data: bytes) -> None:
        with self._state_lock:
            job._done = True
            self.jobs[job.slot] = None  # from here the slot may get its next job...
            self._returning += 1  # ...which this thread takes unless another one is free
            self._results.append(data)
            writing = self._flushing  # if so, that thread sends this one with its next batch
            self._flushing = True
            # With no job running, no handler is opening files that could take the numbers.
            restored = [] if any(self.jobs) else restore_streams(self._log)
        for what in restored:
            note(f"job {job.id} ({job.type}) {what}")
        if writing:
            return
        while True:
            with self._state_lock:
                batch, self._results = self._results, []
                if not batch:
                    self._flushing = False
                    done = self.stopping and not any(self.jobs)
                    break
            self.send_frame(b"".join(batch))
        if done:
            exit_now(0)


def _ignore_signal(signum, frame) -> None:
    pass


def _forked_by_a_handler(own: dict) -> None:
    """In a process a handler forked (multiprocessing's, say): the worker's way with signals
    is not its own. A signal it gets would go down the worker's wakeup pipe (a SIGTERM to it
    stopping the worker), and SIGTERM, left to the worker's loop, would not stop it: both as
    before the worker set them."""
    signal.set_wakeup_fd(-1)
    for sig, handler in own.items():
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def _die_with_parent() -> None:
    """A belt to the EOF braces: the kernel kills this worker when its supervisor dies."""
    try:
        set_parent_death_signal(signal.SIGKILL)
    except OSError as exc:
        print(f"fairsched worker: no parent-death signal ({exc})", file=sys.stderr)


def serve(settings: Settings, handler: Handler, sock: socket.socket) -> NoReturn:
    """Run a worker whose handler is already imported (the template's forked workers)."""
    set_title(f"fairsched: worker {settings.name} ({settings.handler}, supervisor "
              f"{os.getppid()})")
    install_log_streams()
    # Only this process speaks on the channel: a program a handler runs (os.system passes on
    # every inheritable descriptor) must not write into its frames, nor hold it open.
    os.set_inheritable(sock.fileno(), False)
    try:
        Worker(sock, settings, handler).serve()
    except BaseException:
        traceback.print_exc()
    exit_now(EXIT_SOFTWARE)  # the loop itself failed; the traceback is in the log


def main(argv: list[str] | None = None) -> NoReturn:
    """`python -m fairsched.worker [--chdir DIR]`: the cold start of a Python worker."""
    args = sys.argv[1:] if argv is None else argv
    name = os.environ.get("FAIRSCHED_WORKER") or "worker"
    install_log_streams()  # before the handler's import, which may print
    sock = None
    try:
        if args[:1] == ["--chdir"] and len(args) == 2:
            try:
                os.chdir(args[1])
            except OSError as exc:
                raise StartupError(f"cannot enter worker directory {args[1]!r}: "
                                   f"{exc.strerror}") from None
        elif args:
            raise StartupError(f"unexpected arguments {' '.join(args)!r}; "
                               "usage: python -m fairsched.worker [--chdir DIR]")
        settings = settings_from_environ(os.environ)
        sock = open_channel(settings.fd)
        _die_with_parent()
        handler = load_handler(settings.handler)
    except StartupError as exc:
        cannot_start(name, exc, sock)
    serve(settings, handler, sock)
