"""What this user may do with a file or folder, said so that an operator knows what to change
or whom to run a command as; and the one way fairsched makes what it keeps in state_dir (the
control socket, logs, lock files) private to its account."""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat
from pathlib import Path

from fairsched.errors import path_name


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid with no account (a container's, say)
        return f"uid {uid}"


def not_writable(folder: Path) -> str | None:
    """Why this user cannot write into `folder` (or to a socket), which exists, and what to do;
    None when it can."""
    info = folder.stat()
    if os.access(folder, os.W_OK | (os.X_OK if stat.S_ISDIR(info.st_mode) else 0)):
        return None
    me = user_name(os.geteuid())
    owner = user_name(info.st_uid)
    if info.st_uid == os.geteuid():
        return (f"{path_name(folder)} is not writable (mode {info.st_mode & 0o7777:04o}): give {me} "
                f"write access to it")
    return (f"{path_name(folder)} belongs to {owner}, and {me} cannot write to it: run this "
            f"command as {owner}")


def who_may_read(path: Path) -> str:
    try:
        uid = path.stat().st_uid
    except OSError:  # a folder on the way this user may not enter
        return "run this command as a user who may read it"
    if uid == os.geteuid():
        return f"give {user_name(uid)} read access to it"
    return f"it belongs to {user_name(uid)}: run this command as {user_name(uid)}"


PRIVATE_FOLDER = 0o700
PRIVATE_FILE = 0o600


def make_private_folder(folder: Path, *, tighten: bool = True) -> Path:
    """Create `folder` private to this account (0700, made so by mkdir itself: no moment where
    another account could enter it), its missing parents as `mkdir -p` makes them (they are
    not fairsched's to close). A folder that is there already, this account's and open to
    others (as an earlier fairsched left state_dir and its logs), is made private unless not
    `tighten`. Raises OSError as mkdir does: FileExistsError for a file in the way."""
    folder = Path(folder)
    try:
        try:
            os.mkdir(folder, PRIVATE_FOLDER)
        except FileNotFoundError:  # its parents first; a file on the way: NotADirectoryError
            folder.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(folder, PRIVATE_FOLDER)
        created = True
    except FileExistsError:
        created = False
    info = os.stat(folder)
    if not stat.S_ISDIR(info.st_mode):
        raise FileExistsError(errno.EEXIST, "a file is in the way", str(folder))
    if info.st_uid != os.geteuid():
        return folder  # another account's: not_writable says whose
    mode = info.st_mode & 0o7777
    if created and mode != PRIVATE_FOLDER:
        # A umask that takes the owner's own bits away (0277, say) is put right: this adds
        # bits for the owner alone, never one for others.
        os.chmod(folder, PRIVATE_FOLDER)
    elif tighten and mode & 0o077:
        os.chmod(folder, mode & 0o7700)  # the owner's bits stay as the operator set them
    return folder


def open_private(path: Path, flags: int) -> int:
    """os.open(path, flags), creating the file 0600 when missing; a regular file of this
    account's open to others (an earlier fairsched's log, say) is made private. A device or
    FIFO in its place is opened as it is and left as it is."""
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE)
    try:
        info = os.fstat(fd)
        if (stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()
                and info.st_mode & 0o077):
            os.fchmod(fd, info.st_mode & 0o700)
    except OSError:
        os.close(fd)
        raise
    return fd


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` through a new 0600 file renamed into place: a reader finds the
    old content or the new, never a part, and no moment where another account could read it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW), "w") as out:
        out.write(text)
    tmp.replace(path)


def make_files_private(folder: Path) -> None:
    """The regular files of this account's in `folder` (not below it), those open to others
    made private; what cannot be changed is left as it is (the folder is private)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    me = os.geteuid()
    for entry in entries:
        try:
            # Not through a link: its target is not fairsched's. Not blocking: a FIFO.
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # a link, gone meanwhile, or unreadable
            continue
        try:
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode) and info.st_uid == me and info.st_mode & 0o077:
                os.fchmod(fd, info.st_mode & 0o700)
        except OSError:
            pass
        finally:
            os.close(fd)


@contextlib.contextmanager
def private_umask():
    """While a socket is bound: it is made 0600 as it is created (bind takes no mode). The
    umask is the process's: what another thread creates meanwhile is private too, never
    less so."""
    old = os.umask(0o177)
    try:
        yield
    finally:
        os.umask(old)
