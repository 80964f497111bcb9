"""state_dir, its logs and every file in them are private to the supervisor's account: another
local account cannot list them, read a worker's log or reach the control socket, whatever the
umask, and a state_dir an earlier version left open is closed at the next start."""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
from pathlib import Path

import fairsched.permissions  # noqa: F401 - imported here: the stranger cannot read it
from fairsched.control_client import ControlClient, NotRunning
from tests.accounts import STRANGER, as_stranger

WORKERS = """
[[worker]]
name = "w"
types = ["t"]
handler = "sup_handlers:prints_much"
"""


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def attempt(action: str, path: str) -> str:
    """What the stranger gets trying `action` on `path`: "ok" or the errno's name."""
    try:
        if action == "list":
            os.listdir(path)
        elif action == "read":
            with open(path, "rb") as f:
                f.read(1)
        else:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(path)
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return "ok"


def ps(sock: str) -> str:
    """What `fairsched ps` says (after "fairsched: "), asked through the library it calls:
    the stranger may not run this Python (it lives in root's home)."""
    try:
        ControlClient(Path(sock)).ps()
    except NotRunning as exc:
        return str(exc)
    return "answered"


def private_everywhere(state: Path) -> None:
    """state_dir and the folders fairsched keeps in it 0700, every file in them 0600."""
    for folder in (state, state / "logs", state / "control"):
        assert mode(folder) == 0o700, (folder, oct(mode(folder)))
    for folder in (state / "logs", state / "control"):
        for path in folder.iterdir():
            assert mode(path) == 0o600, (path, oct(mode(path)))


def test_another_account_cannot_list_the_state_dir_read_a_log_or_reach_the_socket(
        supervisors):
    sup = supervisors(WORKERS)
    sup.dir.chmod(0o755)  # the config's folder open to all, as /etc/fairsched is
    sup.config.chmod(0o644)
    old = os.umask(0)  # the supervisor inherits it: what it makes must be private regardless
    try:
        sup.start()
    finally:
        os.umask(old)
    done = sup.cli("submit", "t", "--on-demand", "--payload", '{"lines": 3}')
    assert done.returncode == 0, done.stderr
    state = sup.dir / "state"
    log = state / "logs" / "w-1.log"
    assert "err 2" in log.read_text()  # something worth hiding
    private_everywhere(state)
    assert {p.name for p in (state / "logs").iterdir()} >= {"w-1.log", "w.template.log",
                                                           "watchdog.log"}
    sock = state / "control" / "sock"
    assert mode(sock) == 0o600
    assert mode(sup.dir) == 0o755  # not state_dir: left as it was

    assert as_stranger(attempt, "list", str(state)) == "EACCES"
    assert as_stranger(attempt, "read", str(log)) == "EACCES"
    assert as_stranger(attempt, "connect", str(sock)) == "EACCES"
    assert as_stranger(attempt, "list", str(sup.dir)) == "ok"  # so the refusals are state_dir's
    assert as_stranger(ps, str(sock)) == (
        f"cannot reach the supervisor on {sock}: {state} belongs to root, and {STRANGER} "
        "cannot write to it: run this command as root")
    assert [s["state"] for s in sup.slots()] == ["free"]


def test_a_state_dir_an_earlier_version_left_open_is_made_private(supervisors):
    sup = supervisors(WORKERS)
    sup.dir.chmod(0o755)
    state = sup.dir / "state"
    for folder in (state, state / "logs", state / "control"):
        folder.mkdir(mode=0o755)
        folder.chmod(0o755)
    (state / "logs" / "w-1.log").write_text("an earlier run's traceback\n")
    (state / "logs" / "gone-1.log").write_text("a group since removed\n")
    (state / "control" / "supervisor.lock").write_text("1\n")
    for path in [*(state / "logs").iterdir(), state / "control" / "supervisor.lock"]:
        path.chmod(0o644)
    (state / "logs" / "elsewhere.log").symlink_to(sup.config)  # not fairsched's file
    sup.config.chmod(0o644)
    sup.start()
    (state / "logs" / "elsewhere.log").unlink()
    private_everywhere(state)
    assert mode(sup.config) == 0o644 and mode(sup.dir) == 0o755
    assert as_stranger(attempt, "list", str(state)) == "EACCES"
    done = sup.cli("submit", "t", "--on-demand", "--payload", '{"lines": 1}')
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["printed"] == 1
    assert "an earlier run's traceback" in (state / "logs" / "w-1.log").read_text()


def test_folders_above_a_nested_state_dir_are_made_as_mkdir_makes_them(supervisors):
    sup = supervisors(WORKERS)
    sup.config.write_text(sup.config.read_text().replace('state_dir = "state"',
                                                         'state_dir = "var/lib/state"'))
    sup.start()
    umask = os.umask(0)
    os.umask(umask)
    assert mode(sup.dir / "var") == mode(sup.dir / "var" / "lib") == 0o777 & ~umask
    private_everywhere(sup.dir / "var" / "lib" / "state")
