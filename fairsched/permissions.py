"""What this user may do with a file or folder, said so that an operator knows what to change
or whom to run a command as."""

from __future__ import annotations

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
