"""Reading a file a user names (`--config`, `--payload @FILE`): a regular file, and at most so
many bytes of it. A FIFO, a device or a socket is refused at once (a FIFO with no writer would
leave the command waiting for ever, /dev/zero would fill its memory), and so is a file larger
than the caller has room for.
"""

from __future__ import annotations

import errno
import os
import stat

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class FileRefused(ValueError):
    """Not a file fairsched reads; the message says why, to follow the file's name."""


class NotAFile(FileRefused):
    def __init__(self, kind: str):
        super().__init__(f"is {kind}, not a regular file")
        self.kind = kind


class TooLarge(FileRefused):
    def __init__(self, cap: int):
        super().__init__(f"is larger than {size_text(cap)}, the most fairsched reads of it")
        self.cap = cap


def size_text(size: int) -> str:
    """1 MiB, 64 KiB, 1000 bytes: a cap as a message says it."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} bytes"


def _kind(mode: int) -> str | None:
    """What a file of `mode` is when it is neither a regular file nor a folder."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def read_capped(path: str | os.PathLike, cap: int) -> bytes:
    """The bytes of the regular file at `path`, at most `cap` of them: TooLarge past that,
    NotAFile for a FIFO, device or socket (never opened in a way that waits), and OSError as
    open() raises it otherwise (IsADirectoryError for a folder)."""
    kind = _kind(os.stat(path).st_mode)  # most are known before anything is opened
    if kind is not None:
        raise NotAFile(kind)
    # O_NONBLOCK: should a FIFO take the file's place meanwhile, opening it does not wait
    # for a writer; fstat then tells what was opened.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket (or a FIFO's writer end) took its place
            raise NotAFile("a socket") from None
        raise
    with os.fdopen(fd, "rb", buffering=0) as f:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        kind = _kind(info.st_mode)
        if kind is not None:
            raise NotAFile(kind)
        if info.st_size > cap:
            raise TooLarge(cap)
        os.set_blocking(fd, True)
        chunks, size = [], 0
        while size <= cap:  # a file in /proc says it has 0 bytes; one may grow meanwhile
            chunk = f.read(cap + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    if size > cap:
        raise TooLarge(cap)
    return b"".join(chunks)
