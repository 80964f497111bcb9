"""Commands run as a user who cannot use the state_dir (not the supervisor's user) say so in one
line naming the folder, its owner and who to run as."""

import os
import pwd
import subprocess
import sys
from pathlib import Path

WORKERS = """
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:echo"
"""


def other_user() -> int | None:
    """The uid to run commands as: nobody when the tests run as root (which may write
    anywhere), else None, and the test takes write access away from the folders instead."""
    return pwd.getpwnam("nobody").pw_uid if os.geteuid() == 0 else None


def run_as_other(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    uid = other_user()
    prefix = [] if uid is None else ["setpriv", f"--reuid={uid}",
                                     f"--regid={pwd.getpwuid(uid).pw_gid}", "--clear-groups"]
    return subprocess.run([*prefix, sys.executable, "-m", "fairsched", *args],
                          capture_output=True, text=True, timeout=60, cwd="/", env=env)


def deny(*folders: Path, mode: int = 0o555) -> None:
    """Folders the other user must not write to: the tests' own user loses write access."""
    if other_user() is None:
        for folder in folders:
            folder.chmod(mode)


def owner_and_me(folder: Path) -> tuple[str, str]:
    me = pwd.getpwuid(other_user() if other_user() is not None else os.geteuid()).pw_name
    return pwd.getpwuid(folder.stat().st_uid).pw_name, me


def test_supervise_and_queue_commands_on_a_state_dir_of_another_user(short_tmp):
    short_tmp.chmod(0o755)
    config = short_tmp / "workers.toml"
    config.write_text('[supervisor]\nstate_dir = "state"\n' + WORKERS)
    config.chmod(0o644)
    state = short_tmp / "state"
    for folder in (state, state / "logs", state / "control"):
        folder.mkdir(mode=0o755)
    deny(state / "logs", state / "control", state)
    owner, me = owner_and_me(state)
    env = {k: v for k, v in os.environ.items()
           if k not in ("FAIRSCHED_DATABASE_URL", "FAIRSCHED_CONFIG")}
    try:
        for command in (["supervise"], ["jobs"], ["submit", "pdf"]):
            proc = run_as_other(*command, "--config", str(config), env=env)
            lines = proc.stderr.strip().splitlines()
            # Exit 2: no restart (systemd's RestartPreventExitStatus=2) fixes who runs it.
            assert proc.returncode == 2 and len(lines) == 1, (command, proc.stderr)
            assert lines[0].startswith(f"fairsched: {config}: [supervisor] key 'state_dir': "), \
                lines
            if owner == me:  # the tests' own user, without write access
                assert lines[0].endswith(f"is not writable (mode 0555): give {me} write "
                                         "access to it"), lines
            else:
                assert lines[0].endswith(f"belongs to {owner}, and {me} cannot write to it: "
                                         f"run this command as {owner}"), lines
        assert not list(state.rglob("*.sock")) and not (state / "pg").exists()
    finally:
        for folder in (state, state / "logs", state / "control"):
            folder.chmod(0o755)


def test_ps_stop_and_restart_as_another_user_say_whose_supervisor_it_is(supervisors):
    sup = supervisors(WORKERS).start()
    sup.dir.chmod(0o755)
    sup.config.chmod(0o644)
    control = sup.config.parent / "state" / "control"
    deny(control, mode=0)  # its socket is the tests' user's: no way to it at all
    owner, me = owner_and_me(control)
    try:
        for command in (["ps"], ["ps", "--watch"], ["stop"], ["restart", "pdf"]):
            proc = run_as_other(*command, "--config", str(sup.config), env=sup.env)
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode == 1 and len(lines) == 1, (command, proc.stderr)
            assert lines[0].startswith(
                f"fairsched: cannot reach the supervisor on {control / 'sock'}: "), lines
            if owner == me:
                assert lines[0].endswith(f"give {me} write access to it"), lines
            else:
                # state_dir, private, is the first folder on the way another user meets
                assert lines[0].endswith(f"{control.parent} belongs to {owner}, and {me} cannot "
                                         f"write to it: run this command as {owner}"), lines
    finally:
        control.chmod(0o700)
    assert [s["state"] for s in sup.slots()] == ["free"]  # neither stopped nor restarted


def test_a_workers_toml_this_user_cannot_read_is_one_line_naming_its_owner(short_tmp):
    short_tmp.chmod(0o755)
    config = short_tmp / "workers.toml"
    config.write_text('[supervisor]\nstate_dir = "state"\n' + WORKERS)
    config.chmod(0o600 if other_user() is not None else 0)
    owner, me = owner_and_me(config)
    how = (f"give {me} read access to it" if owner == me
           else f"it belongs to {owner}: run this command as {owner}")
    for command in (["ps"], ["jobs"], ["supervise"]):
        proc = run_as_other(*command, "--config", str(config))
        assert proc.returncode == 2, (command, proc.stderr)
        assert proc.stderr == f"fairsched: {config}: cannot read: Permission denied ({how})\n", \
            (command, proc.stderr)
