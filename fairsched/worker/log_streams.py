"""A Python worker's print streams: sys.stdout and sys.stderr on its log file, which drop what
the file system has no room for (a full disk, a quota) rather than fail the handler that
printed it; the next job outcome tells the supervisor, which logs it.
"""

from __future__ import annotations

import errno
import io
import json
import sys

from fairsched.protocol import ProtocolError, encode

NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})

_lost: str | None = None  # why output was dropped since the supervisor was last told


class _LogFile(io.FileIO):
    def write(self, data) -> int:
        global _lost
        try:
            return super().write(data)
        except OSError as exc:
            if exc.errno not in NO_ROOM:
                raise
            _lost = exc.strerror or str(exc)
            return memoryview(data).nbytes


def log_stream(fd: int, like=None) -> io.TextIOWrapper:
    """A line-buffered text stream on `fd`, with the encoding and error handler of `like`."""
    encoding = getattr(like, "encoding", None) or "utf-8"
    errors = getattr(like, "errors", None) or "backslashreplace"
    return io.TextIOWrapper(io.BufferedWriter(_LogFile(fd, "w", closefd=False)),
                            encoding=encoding, errors=errors, line_buffering=True)


def install() -> None:
    """sys.stdout and sys.stderr (and sys.__stdout__, sys.__stderr__, which the worker puts
    back when a handler leaves them closed) as log streams, where they are still Python's own
    on fds 1 and 2: one a handler's import put in their place is left alone."""
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
