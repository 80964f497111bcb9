"""A Python worker's print streams: sys.stdout and sys.stderr on its log file.

Each line written through them starts with the time (UTC, to the millisecond, as the
supervisor's log) and, when it can be told, the job it was written for ("job 17 (pdf): "),
whoever wrote it: the handler's print, warnings, the logging module, a library. fairsched's
own lines about a job carry both already and are written `plain()`. The log rotates at
FAIRSCHED_LOG_MAX_BYTES (fairsched/log_files.py). What the file system has no room for (a full
disk, a quota) is dropped rather than failing the handler that printed it; the next job outcome
tells the supervisor, which logs it.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import stat
import sys
import threading
import time
from pathlib import Path

from fairsched.log_files import rotate_mine
from fairsched.protocol import ProtocolError, encode

NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})

_lost: str | None = None  # why output was dropped since the supervisor was last told


# -- which job wrote a line ---------------------------------------------------------------------

_labels: dict[int, str] = {}  # by thread: "job 17 (pdf)" while that thread runs the job
_plain = threading.local()


def job_started(job) -> None:
    """Lines this thread writes from now on are the job's."""
    _labels[threading.get_ident()] = f"job {job.id} ({job.type})"


def job_ended() -> None:
    _labels.pop(threading.get_ident(), None)


def _label() -> str | None:
    """The job of this thread, or else the only job running (a line from a thread its handler
    or a library started: with two jobs running, no telling whose)."""
    label = _labels.get(threading.get_ident())
    if label is None:
        running = list(_labels.values())
        if len(running) == 1:
            label = running[0]
    return label


@contextlib.contextmanager
def plain():
    """Lines this thread writes meanwhile go out as they are (stamped by their writer)."""
    before = getattr(_plain, "on", False)
    _plain.on = True
    try:
        yield
    finally:
        _plain.on = before


_second: tuple[int, str] = (-1, "")


def stamp(now: float | None = None) -> str:
    """2026-11-24T10:12:03.123Z: the time as the worker's log lines start with it."""
    global _second
    now = time.time() if now is None else now
    second, text = _second
    if int(now) != second:
        second, text = int(now), time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
        _second = (second, text)
    return f"{text}.{int(now % 1 * 1000):03d}Z"


# -- rotation -------------------------------------------------------------------------------

class _Rotation:
    """This worker's log, renamed once a write would take it past max_bytes."""

    def __init__(self, path: Path, max_bytes: int, backups: int):
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.lock = threading.Lock()
        # The files that have been this log, as (st_dev, st_ino): a file a handler put on
        # fd 1 or 2 (os.dup2 onto it) is the handler's, never rotated nor moved away from.
        self.files: set[tuple[int, int]] = set()
        with contextlib.suppress(OSError):
            info = os.stat(path)
            self.files.add((info.st_dev, info.st_ino))

    def make_room(self, fd: int, adding: int) -> None:
        info = os.fstat(fd)
        if (info.st_size + adding <= self.max_bytes or not stat.S_ISREG(info.st_mode)
                or (info.st_dev, info.st_ino) not in self.files):
            return
        with self.lock:  # one thread rotates; the others find the new file
            new = rotate_mine(self.path, fd, adding, self.max_bytes, self.backups)
            if new is None:
                return
            try:
                now = os.fstat(new)
                self.files.add((now.st_dev, now.st_ino))
                # Every descriptor of the worker's on the old file moves: its standard
                # streams (C code writes there too), and the copy it keeps of them.
                for target in {fd, 1, 2, *_kept}:
                    with contextlib.suppress(OSError):
                        moved = os.fstat(target)
                        if (moved.st_dev, moved.st_ino) == (info.st_dev, info.st_ino):
                            os.dup2(new, target, inheritable=target <= 2)
            finally:
                os.close(new)


_rotation: _Rotation | None = None
_kept: set[int] = set()  # other descriptors of the worker's on its log


def configure(environ=os.environ) -> None:
    """Rotate the log as FAIRSCHED_LOG, FAIRSCHED_LOG_MAX_BYTES and FAIRSCHED_LOG_BACKUPS say
    (no rotation without them, or with a size of 0)."""
    global _rotation
    try:
        max_bytes = int(environ.get("FAIRSCHED_LOG_MAX_BYTES", "0"))
        backups = max(0, int(environ.get("FAIRSCHED_LOG_BACKUPS", "0")))
    except ValueError:
        max_bytes = 0
    path = environ.get("FAIRSCHED_LOG")
    _rotation = _Rotation(Path(path), max_bytes, backups) if path and max_bytes > 0 else None


def keep(fd: int | None) -> None:
    """`fd`, another descriptor on the log, moves with the streams when the log rotates."""
    if fd is not None:
        _kept.add(fd)


# -- the streams ----------------------------------------------------------------------------

class _LogFile(io.FileIO):
    def write(self, data) -> int:
        global _lost, _rotation
        rotation = _rotation
        if rotation is not None:
            try:
                rotation.make_room(self.fileno(), memoryview(data).nbytes)
            except OSError:  # cannot rename in the logs folder: the supervisor copies it
                _rotation = None
        try:
            return super().write(data)
        except OSError as exc:
            if exc.errno not in NO_ROOM:
                raise
            _lost = exc.strerror or str(exc)
            return memoryview(data).nbytes


class _LogStream(io.TextIOWrapper):
    """Line-buffered text on the log; every line starts with the time and its job."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._line_start = True
        self._lock = threading.RLock()
        _streams.append(self)

    def write(self, s) -> int:
        if not isinstance(s, str) or not s:
            return super().write(s)
        with self._lock:
            if getattr(_plain, "on", False):
                super().write(s)
            else:
                super().write(self._stamped(s))
            self._line_start = s.endswith("\n")
        return len(s)

    def _stamped(self, text: str) -> str:
        prefix = None
        out = []
        lines = text.split("\n")
        for n, line in enumerate(lines):
            if line and (n > 0 or self._line_start):  # a blank line stays blank
                if prefix is None:
                    label = _label()
                    prefix = f"{stamp()} {label}: " if label else f"{stamp()} "
                out.append(prefix)
            out.append(line)
            if n < len(lines) - 1:
                out.append("\n")
        return "".join(out)


_streams: list[_LogStream] = []


def _forked() -> None:
    """In a process a handler forked: a lock another thread held at the fork stays held in it
    for good, and its first print would wait for ever."""
    for stream in _streams:
        stream._lock = threading.RLock()
    if _rotation is not None:
        _rotation.lock = threading.Lock()


os.register_at_fork(after_in_child=_forked)


def log_stream(fd: int, like=None) -> io.TextIOWrapper:
    """A line-buffered text stream on `fd`, with the encoding and error handler of `like`."""
    encoding = getattr(like, "encoding", None) or "utf-8"
    errors = getattr(like, "errors", None) or "backslashreplace"
    return _LogStream(io.BufferedWriter(_LogFile(fd, "w", closefd=False)),
                      encoding=encoding, errors=errors, line_buffering=True)


class _LastResort(logging.StreamHandler):
    """What the logging module writes when no handler was set up: its level and logger too,
    on whatever sys.stderr is then (which stamps it)."""

    def __init__(self):
        super().__init__()
        self.setLevel(logging.WARNING)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def install() -> None:
    """sys.stdout and sys.stderr (and sys.__stdout__, sys.__stderr__, which the worker puts
    back when a handler leaves them closed) as log streams, where they are still Python's own
    on fds 1 and 2: one a handler's import put in their place is left alone. The log's
    rotation as the environment says (a worker forked from its template has its own)."""
    configure()
    # Python's own (one a handler put there stays).
    if type(logging.lastResort) is getattr(logging, "_StderrHandler", None):
        logging.lastResort = _LastResort()
    for fd, name in ((1, "stdout"), (2, "stderr")):
        stream = getattr(sys, name)
        try:
            if (stream is not getattr(sys, f"__{name}__") or stream.fileno() != fd
                    or isinstance(getattr(stream.buffer, "raw", None), _LogFile)):
                continue
            stream.flush()
            replacement = log_stream(fd, stream)
        except (OSError, ValueError, AttributeError):  # closed, or not a file's
            continue
        setattr(sys, name, replacement)
        setattr(sys, f"__{name}__", replacement)


def tell_lost(frame: bytes) -> bytes:
    """`frame`, a job's outcome, carrying `log_lost` (why) when output was dropped since the
    last one that did."""
    global _lost
    lost, _lost = _lost, None
    if lost is None:
        return frame
    try:
        return encode({**json.loads(frame[4:]), "log_lost": lost})
    except (ValueError, ProtocolError):  # at the frame size cap: the outcome matters more
        return frame
