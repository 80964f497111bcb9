"""A second local account, for tests that prove what another user on the host cannot reach.

The tests run as root, so they can create an ordinary account and run a function as it in a
forked child: real syscalls under a real uid, no stand-in. `as_stranger(fn, *args)` returns
what `fn` returned there (or raises what it raised, as a StrangerFailed with its message).
"""

from __future__ import annotations

import os
import pickle
import pwd
import subprocess
import traceback

import pytest

STRANGER = "fairsched-stranger"


class StrangerFailed(Exception):
    """What the function run as the stranger raised, with its type and message."""


def stranger_account() -> pwd.struct_passwd:
    """The unprivileged account, created (no home, no login shell) when missing."""
    try:
        return pwd.getpwnam(STRANGER)
    except KeyError:
        pass
    if os.geteuid() != 0:
        pytest.fail("these tests create a second account and need to run as root")
    done = subprocess.run(["useradd", "--system", "--no-create-home", "--user-group",
                           "--shell", "/usr/sbin/nologin", STRANGER], capture_output=True)
    try:  # made by this call, or by another test process at the same moment
        return pwd.getpwnam(STRANGER)
    except KeyError:
        pytest.fail(f"useradd {STRANGER} failed: {done.stderr.decode().strip()}")


def as_stranger(fn, *args):
    """Run fn(*args) in a child that has become the stranger account; its result, pickled."""
    account = stranger_account()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop every privilege before doing anything
        status = 0
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)
            os.environ["HOME"] = "/nonexistent"
            os.environ["USER"] = os.environ["LOGNAME"] = STRANGER
            try:
                outcome = ("ok", fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the parent whole
                outcome = ("raised", f"{type(exc).__name__}: {exc}",
                           traceback.format_exc())
            data = pickle.dumps(outcome)
            with os.fdopen(write_end, "wb") as out:
                out.write(data)
        except BaseException:  # noqa: BLE001
            status = 1
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as inp:
        data = inp.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        raise AssertionError(f"the child run as {STRANGER} died (status {status})")
    outcome = pickle.loads(data)
    if outcome[0] == "raised":
        raise StrangerFailed(outcome[1])
    return outcome[1]
