"""Worker log files (`<state_dir>/logs/<worker>.log`) rotated at `[supervisor] log_max_bytes`,
keeping `log_backups` older ones beside them (`pdf-1.log.1` the newest), private as the rest of
state_dir.

Two ways, one lock. A Python worker rotates its own log the moment a write would take it past
the size: it renames it and goes on in a new file, its standard streams moved onto it (so what
C code writes follows). The supervisor looks at every log each second and copies and truncates
one that is still too large (a `command` worker's, a template's, the watchdog's, or one that
C code filled), as logrotate's copytruncate does: the writers keep their descriptors, which
append (O_APPEND) to the emptied file. Both hold an flock on the file at the log's path while
they rotate, so neither rotates what the other just did.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from fairsched.permissions import open_private

# Attempts at locking the file at a log's path while other processes keep rotating it.
LOCK_ATTEMPTS = 5


def backup(path: Path, n: int) -> Path:
    """The n-th older copy of the log at `path` (pdf-1.log.1 the newest)."""
    return path.with_name(f"{path.name}.{n}")


@contextlib.contextmanager
def locked(path: Path, flags: int = os.O_RDONLY) -> Iterator[tuple[int, os.stat_result] | None]:
    """The regular file at `path`, opened with `flags` and locked for a rotation: (its fd,
    its stat); None when there is none, or something else is there (a FIFO, a device, a
    link: an operator's, left alone)."""
    for _ in range(LOCK_ATTEMPTS):
        try:
            fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # gone, a link (ELOOP), a FIFO with no reader (ENXIO)
            yield None
            return
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                yield None
                return
            fcntl.flock(fd, fcntl.LOCK_EX)
            # Another process may have rotated it while this one waited: the path's file now.
            try:
                now = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino):
                yield fd, os.fstat(fd)
                return
        finally:
            os.close(fd)  # and with it the lock
    yield None


def shift_backups(path: Path, backups: int, *, current: bool) -> None:
    """pdf-1.log.2 to .3, .1 to .2 ... the oldest beyond `backups` replaced; with `current`,
    the log itself to .1."""
    for n in range(backups - 1, 0, -1):
        with contextlib.suppress(FileNotFoundError):
            os.rename(backup(path, n), backup(path, n + 1))
    if current:
        os.rename(path, backup(path, 1))


def rotate_mine(path: Path, fd: int, adding: int, max_bytes: int, backups: int) -> int | None:
    """A Python worker about to write `adding` bytes to its log through `fd`: when they would
    take it past `max_bytes`, the log is rotated (renamed, or emptied when no backup is kept).
    Returns a descriptor of the file now at `path` to move the worker's streams onto (the
    caller closes it), or None to write on where it was."""
    with locked(path) as held:
        if held is None:
            if os.path.lexists(path):  # a FIFO, a link: not a file to rotate
                return None
            # Removed (by hand, say): a new one there, rather than writing on for ever
            # into a file no one can see.
            return open_private(path, os.O_WRONLY | os.O_APPEND)
        _, current = held
        mine = os.fstat(fd)
        if (mine.st_dev, mine.st_ino) != (current.st_dev, current.st_ino):
            # Rotated by another process writing to this log (the worker's previous
            # incarnation, still stopping): follow it to the new file.
            return open_private(path, os.O_WRONLY | os.O_APPEND)
        if current.st_size + adding <= max_bytes or current.st_size == 0:
            return None  # emptied meanwhile (the supervisor's copy), or one write too big
        if backups == 0:
            os.ftruncate(fd, 0)
            return None
        shift_backups(path, backups, current=True)
        return open_private(path, os.O_WRONLY | os.O_APPEND)


def copy_and_truncate(path: Path, max_bytes: int, backups: int) -> bool:
    """The log at `path`, when past `max_bytes`, copied to its first backup and emptied in
    place, for writers that cannot be told to move to a new file. Whether it was. What is
    written between the end of the copy and the truncation is lost (a few bytes at most:
    the copy goes on until it has caught up)."""
    with locked(path, os.O_RDWR) as held:
        if held is None or held[1].st_size <= max_bytes:
            return False
        fd, info = held
        if backups > 0:
            shift_backups(path, backups, current=False)
            out = open_private(backup(path, 1), os.O_WRONLY | os.O_TRUNC)
            try:
                offset, size = 0, info.st_size
                while offset < size:
                    copied = _copy(fd, out, offset, size - offset)
                    if copied == 0:  # truncated by someone else meanwhile
                        break
                    offset += copied
                    if offset >= size:
                        size = os.fstat(fd).st_size  # what was appended meanwhile
            finally:
                os.close(out)
        os.ftruncate(fd, 0)
        return True


def _copy(source: int, target: int, offset: int, count: int) -> int:
    """Bytes of `source` from `offset` appended to `target` in the kernel; how many."""
    try:
        return os.copy_file_range(source, target, count, offset)
    except OSError as exc:  # a file system or kernel without it
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise
    return os.sendfile(target, source, offset, count)
