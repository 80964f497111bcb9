"""Load and validate workers.toml into frozen settings; every mistake is one ConfigError line.

The messages name the file, the key and the problem, e.g.
``workers.toml: [[worker]] 'pdf': key 'slots' must be an integer >= 1, got 0``.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import stat
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fairsched.core.weights import Weights
from fairsched.errors import ConfigError, given, long_integer, path_name
from fairsched.files import FileRefused, read_capped
from fairsched.permissions import (
    make_files_private,
    make_private_folder,
    not_writable,
    who_may_read,
)
from fairsched.store.rows import job_row
from fairsched.type_names import tenant_name_problem, type_name_problem

DEFAULT_CONFIG = "workers.toml"
DEFAULT_STATE_DIR = ".fairsched"  # beside workers.toml
MAX_CONFIG = 1 << 20  # bytes of workers.toml read: a thousand worker groups fit ten times over
MAX_SOCKET_PATH = 107  # bytes of a Unix socket's path on Linux (sun_path less its NUL)
MAX_WEIGHT = 1e12  # points: larger weights add nothing but float trouble
# Seconds of lease: a quarter of it is each database connection's statement_timeout, which
# PostgreSQL takes up to 2^31 - 1 ms; a third its TCP keepalive idle time, up to 32767 s.
MAX_LEASE = 86400
# Seconds: the shortest heartbeat_interval and poll_interval. Shorter, a supervisor spends its
# time on heartbeats or fetches (a database round trip each) and gains nothing for it.
MIN_INTERVAL = 0.1
LONG_INTEGER = 10**20  # and longer: a message gives its number of digits, not the digits
MAX_LEVEL_SECONDS = 1e12  # priority_weight / age_weight: the wait one priority level is worth
MAX_HALF_LIFE = 10 * 365 * 24 * 3600.0  # usage_half_life: ten years
MAX_LIMIT = 1_000_000  # [limits] N
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]*")
HANDLER_RE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
ON_TIMEOUT = ("retry", "fail")  # [[worker]] on_timeout: what becomes of a job past its timeout
MAX_GRACE = 86400.0  # seconds of cancel_grace: a timer the loop can arm
AGE_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
MAX_AGE_DAYS = 36500  # a century: past that, PostgreSQL's intervals overflow soon enough
_AGE = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhd]?)")
SIZE_UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
_SIZE = re.compile(r"([0-9]+) ?([KMG]?B)?", re.IGNORECASE)
MIN_LOG_SIZE = 1 << 10  # bytes: a worker log rotated more often would be all rotations
MAX_LOG_BACKUPS = 1000
_RANGE = re.compile(r"\s*([0-9]{1,12})\s*\.\.\s*([0-9]{1,12})\s*")  # processes = "1..8"
MAX_PROCESSES = 1000
DEFAULT_IDLE_TIMEOUT = 60.0  # seconds an autoscaled group's extra process may stay idle
_ADDRESS = re.compile(r"(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\s\[\]]*)):(?P<port>[0-9]{1,5})")


def age_seconds(text: str) -> float:
    """Seconds of an age such as 30d, 12h, 45m, 90s or 90 (seconds); ValueError saying what
    is wrong, to follow the name of the option or key."""
    found = _AGE.fullmatch(text)
    if found is None:
        raise ValueError(f"must be an age such as 30d, 12h, 45m or 90s, got {given(text)}")
    seconds = float(found[1]) * AGE_UNITS[found[2] or "s"]
    if not seconds <= MAX_AGE_DAYS * 86400:
        raise ValueError(f"must be at most {MAX_AGE_DAYS}d, got {given(text)}")
    return seconds


def size_bytes(text: str) -> int:
    """Bytes of a size such as 50MB, 300 KB or 1024 (B, KB, MB, GB: powers of 1024);
    ValueError saying what is wrong, to follow the name of the key."""
    found = _SIZE.fullmatch(text)
    if found is None:
        raise ValueError(f"must be a size such as \"50MB\" (B, KB, MB or GB, powers of 1024) "
                         f"or a number of bytes, got {text!r}")
    return int(found[1]) * SIZE_UNITS[(found[2] or "B").upper()]


def size_text(n: int) -> str:
    """A size as the config writes them: 100MB, 1.5GB, 512KB, 300B (powers of 1024)."""
    for unit in ("GB", "MB", "KB"):
        scale = SIZE_UNITS[unit]
        if n >= scale:
            return f"{n / scale:.1f}".removesuffix(".0") + unit
    return f"{n}B"


def age_text(seconds: float) -> str:
    """30d, 12h, 45m or 90s: the largest unit a whole number of which `seconds` is."""
    for unit, size in AGE_UNITS.items():
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def metrics_address(address: str) -> tuple[str, int, bool] | None:
    """(host, port, is_ipv6) of "host:port" or "[ipv6]:port", or None when it is neither.
    An empty host stays empty: it means every interface."""
    match = _ADDRESS.fullmatch(address)
    if match is None or int(match["port"]) > 65535:
        return None
    if match["ipv6"] is not None:
        return match["ipv6"], int(match["port"]), True
    return match["host"], int(match["port"]), False


def _check_host(sup: _Section, key: str, value: str, host: str) -> None:
    """The host of `key`'s "host:port" is a host name: what the socket module does to a name
    before resolving it (IDNA) would fail on another as a TypeError, not as a name that does
    not resolve."""
    try:
        host.encode("idna")
    except UnicodeError:
        sup.fail(key, f"has a host that is no host name (a label empty or over 63 "
                      f"characters), got {value!r}")


MIN_WEB_TOKEN = 16  # characters of a web_token given in workers.toml


def _check_web(sup: _Section, supervisor: SupervisorSettings) -> None:
    """[supervisor] web: "host:port" or "[ipv6]:port", port 1 to 65535 (the dashboard listens
    where it is told, not on a port the system picks); web_token: long enough, printable."""
    if supervisor.web is not None:
        address = metrics_address(supervisor.web)
        if address is None or not address[0] or address[1] == 0:
            sup.fail("web", f"must look like 'host:port' or '[ipv6]:port' (a host, and a port "
                            f"1 to 65535), got {supervisor.web!r}")
        _check_host(sup, "web", supervisor.web, address[0])
    token = supervisor.web_token
    if token is not None and (len(token) < MIN_WEB_TOKEN or not token.isascii()
                              or not token.isprintable() or " " in token):
        sup.fail("web_token", f"must be at least {MIN_WEB_TOKEN} printable ASCII characters "
                              "without spaces (it goes in an HTTP header)")


@dataclass(frozen=True)
class SupervisorSettings:
    state_dir: Path
    shutdown_timeout: float = 10.0
    database: str | None = None
    lease: float = 15.0
    heartbeat_interval: float = 3.0
    poll_interval: float = 5.0
    metrics: str | None = None
    prune_after: float | None = None  # seconds after which finished jobs are deleted
    log_max_bytes: int = 50 << 20  # a worker log rotates past this size (0: never)
    log_backups: int = 3  # rotated worker logs kept beside each
    web: str | None = None  # "host:port" of the web dashboard (off when None)
    web_token: str | None = None  # the dashboard's token; else generated into state_dir


@dataclass(frozen=True)
class WorkerSpec:
    name: str
    types: tuple[str, ...]
    handler: str | None
    command: tuple[str, ...] | None
    processes: int = 1
    slots: int = 1
    max_attempts: int = 3
    timeout: float | None = None
    on_timeout: str = "retry"  # a job past its timeout: tried again ("retry") or "fail"
    cancel_grace: float = 10.0  # seconds a cancelled job may run on before its worker is stopped
    start_timeout: float = 60.0  # seconds to import the handler and say hello
    retry_backoff: float = 1.0
    max_restarts: int = 5
    restart_window: float = 60.0
    # Recycling (docs/operations.md, "Leaks"): a process is replaced after about max_jobs jobs,
    # or after a job that leaves it above max_rss bytes; above rss_limit it is killed at once.
    max_jobs: int | None = None
    max_rss: int | None = None
    rss_limit: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path = Path(".")
    # processes = "MIN..MAX": `processes` is MIN (the group starts with it), this is MAX;
    # None for a fixed number of processes.
    max_processes: int | None = None
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT  # autoscaled: seconds idle before one stops

    @property
    def autoscaled(self) -> bool:
        return self.max_processes is not None

    @property
    def process_range(self) -> tuple[int, int]:
        """(MIN, MAX) processes: equal for a fixed number."""
        return self.processes, (self.processes if self.max_processes is None
                                else self.max_processes)


@dataclass(frozen=True)
class ScheduleSpec:
    """A [[schedule]]: a job of `type` enqueued at each due time of `cron` (5 fields, UTC) or
    of `every` seconds (the multiples of it since the Unix epoch, so every host agrees)."""
    name: str
    type: str
    cron: str | None
    every: float | None
    payload: Any = None
    priority: int = 0
    tenant: str | None = None  # who its jobs are for (None: the default tenant)

    @property
    def when(self) -> str:
        """The schedule as workers.toml gives it: the cron expression, or "every 30s"."""
        return self.cron if self.cron is not None else f"every {age_text(self.every)}"


@dataclass(frozen=True)
class Config:
    path: Path
    supervisor: SupervisorSettings
    scoring: Weights
    matching: str
    workers: tuple[WorkerSpec, ...]
    schedules: tuple[ScheduleSpec, ...] = ()
    usage_half_life: float = 600.0  # [scoring]: seconds for a tenant's usage to halve
    limits: dict[str, int] = field(default_factory=dict)  # [limits]: type -> at most N at once

    @property
    def types(self) -> set[str]:
        return {t for w in self.workers for t in w.types}

    def unknown_type(self, type_name: str, *, absolute: bool = False,
                     suggest: bool = False) -> str:
        """What submit, jobs and retry say of a type no worker group here runs (`absolute`:
        the file's full path, for a reader whose current folder may not be ours; `suggest`:
        the configured type closest to it, for one just typed)."""
        path = self.path.absolute() if absolute else self.path
        types = sorted(self.types)
        close = difflib.get_close_matches(type_name, types, n=1) if suggest else []
        return (f"no worker group in {path_name(path)} runs type {type_name!r}"
                f" (configured types: {', '.join(types)})"
                + (f"; did you mean {close[0]!r}?" if close else ""))

    @property
    def control_socket(self) -> Path:
        return control_socket_in(self.supervisor.state_dir)

    def worker(self, name: str) -> WorkerSpec | None:
        return next((w for w in self.workers if w.name == name), None)

    def make_state_dir(self) -> Path:
        """Create state_dir and its logs and control folders, private to this account (those
        an earlier version left open to others are closed); one line naming the setting when
        that cannot be done."""
        state_dir = self.supervisor.state_dir
        for folder in (state_dir, state_dir / "logs", state_dir / "control"):
            try:
                make_private_folder(folder)
            except OSError as exc:
                why = exc.strerror or str(exc)
                if isinstance(exc, FileExistsError) or (folder.exists() and not folder.is_dir()):
                    why = "a file is in the way"
                raise ConfigError(f"{path_name(self.path)}: [supervisor] key 'state_dir': "
                                  f"cannot create {path_name(exc.filename or folder)}: "
                                  f"{why}") from exc
            problem = not_writable(folder)
            if problem:  # another user's: the supervisor's, when this is a command for it
                raise ConfigError(f"{path_name(self.path)}: [supervisor] key 'state_dir': "
                                  f"{problem}")
        make_files_private(state_dir / "logs")  # an earlier version's, of groups gone too
        return state_dir

    def max_attempts_by_type(self) -> dict[str, int]:
        """The `max_attempts` a job without its own gets when claimed: that of the first
        worker group that handles its type."""
        defaults: dict[str, int] = {}
        for spec in self.workers:
            for t in spec.types:
                defaults.setdefault(t, spec.max_attempts)
        return defaults


def resolve_config_path(option: str | None) -> Path:
    """--config, else FAIRSCHED_CONFIG, else ./workers.toml."""
    if option == "":
        raise ConfigError("--config is empty: give the path of a workers.toml")
    return Path(option or os.environ.get("FAIRSCHED_CONFIG") or DEFAULT_CONFIG)


class _Section:
    """Reads typed keys from one TOML table and reports unknown ones."""

    def __init__(self, file: str, where: str, table: Any):
        self.file = file
        self.where = where
        if not isinstance(table, dict):
            self.fail(None, f"must be a table, got {_kind(table)}")
        self.table = table
        self.seen: set[str] = set()

    def fail(self, key: str | None, problem: str):
        place = f"{self.where} key {_key_name(key)}" if key else self.where
        raise ConfigError(f"{self.file}: {place} {problem}")

    def get(self, key: str, kind: str, default: Any = None, *, required: bool = False,
            minimum: float | None = None, above: float | None = None,
            maximum: float | None = None) -> Any:
        self.seen.add(key)
        if key not in self.table:
            if required:
                self.fail(key, "is required")
            return default
        value = self.table[key]
        if kind == "size":  # "50MB", or a number of bytes
            if isinstance(value, str):
                try:
                    value = size_bytes(value)
                except ValueError as exc:
                    self.fail(key, str(exc))
            elif isinstance(value, bool) or not isinstance(value, int):
                self.fail(key, f"must be a size such as \"50MB\" or a number of bytes, got "
                               f"{_kind(value)}")
            kind = "int"
        if kind == "age":  # "30d", as the prune command takes it, or a number of seconds
            if isinstance(value, str):
                return self._age(key, value, minimum, maximum)
            if isinstance(value, bool) or not isinstance(value, int | float):
                self.fail(key, f"must be an age such as \"30d\" or a number of seconds, got "
                               f"{_kind(value)}")
            kind = "number"
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                self.fail(key, f"must be an integer, got {_kind(value)}")
        elif kind == "number":
            if isinstance(value, bool) or not isinstance(value, int | float):
                self.fail(key, f"must be a number, got {_kind(value)}")
            try:
                value = float(value)
            except OverflowError:  # an integer past 1.8e308
                self.fail(key, f"must be a finite number, got {_kind(value)}")
            if not math.isfinite(value):  # TOML has nan and inf; no setting means either
                self.fail(key, f"must be a finite number, got {value!r}")
        elif kind == "str":
            if not isinstance(value, str) or not value:
                self.fail(key, f"must be a non-empty string, got {_kind(value)}")
            if "\0" in value:
                self.fail(key, "must not hold a NUL character")
        elif kind == "strlist":
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                self.fail(key, f"must be a list of non-empty strings, got {_kind(value)}")
            if any("\0" in v for v in value):
                self.fail(key, "must not hold a NUL character")
        elif kind == "table":
            if not isinstance(value, dict):
                self.fail(key, f"must be a table, got {_kind(value)}")
        elif kind == "list":
            if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                self.fail(key, f"must be an array of tables ([[{key}]])")
        elif kind == "strtable":
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                self.fail(key, "must be a table of strings")
            for name, text in value.items():
                if not name or "=" in name or "\0" in name or "\0" in text:
                    self.fail(key, f"has an entry no environment can hold: {name!r}")
        if minimum is not None and value < minimum:
            self.fail(key, f"must be >= {_bound(minimum)}, got {_number(value)}")
        if above is not None and value <= above:
            self.fail(key, f"must be > {_bound(above)}, got {_number(value)}")
        if maximum is not None and value > maximum:
            self.fail(key, f"must be <= {_bound(maximum)}, got {_number(value)}")
        return value

    def _age(self, key: str, text: str, minimum: float | None, maximum: float | None) -> float:
        try:
            seconds = age_seconds(text)
        except ValueError as exc:
            self.fail(key, str(exc))
        if minimum is not None and seconds < minimum:
            self.fail(key, f"must be at least {age_text(minimum)}, got {text!r}")
        if maximum is not None and seconds > maximum:
            self.fail(key, f"must be at most {age_text(maximum)}, got {text!r}")
        return seconds

    def finish(self):
        unknown = sorted(set(self.table) - self.seen)
        if unknown:
            self.fail(unknown[0], "is not a known setting")


def _key_name(key: str) -> str:
    """A key as the message shows it: quoted, with a line break or other control character in
    it spelled out (\\n), so that the message stays one line."""
    return f"'{key}'" if key.isprintable() else repr(key)


def _bound(limit: float) -> str:
    """A bound as a user reads it: integers in full (2147483647), others short (1e+12)."""
    return str(limit) if isinstance(limit, int) else f"{limit:g}"


def _number(value: float) -> str:
    """A number as a message shows it: an integer too long to read at a glance by its length."""
    if isinstance(value, int) and abs(value) >= LONG_INTEGER:
        return f"an integer of {len(str(abs(value)))} digits"
    return repr(value)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, int) and abs(value) >= LONG_INTEGER:
        return _number(value)
    if isinstance(value, int | float):
        return f"number {value!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def control_socket_in(state_dir: str | os.PathLike) -> Path:
    """Where a supervisor on `state_dir` listens for commands."""
    return Path(state_dir) / "control" / "sock"


def control_socket_of(path: str | os.PathLike) -> Path:
    """Where the supervisor started from the config at `path` listens. A file broken since then
    (a typo in a new worker) still tells its state_dir, so `ps` and `stop` go on working."""
    try:
        return load_config(path).control_socket
    except ConfigError as exc:
        error = exc
    try:
        state_dir = read_config(Path(path)).get("supervisor", {}).get("state_dir",
                                                                      DEFAULT_STATE_DIR)
    except (ConfigError, AttributeError):
        raise error from None
    if not isinstance(state_dir, str) or not state_dir:
        raise error
    socket_path = Path(path).resolve().parent / state_dir / "control" / "sock"
    if len(os.fsencode(socket_path)) > MAX_SOCKET_PATH:  # no supervisor can listen there
        raise error
    return socket_path


def _long_integer_in(text: str) -> str:
    """Which integer of `text` has more digits than Python reads, and on which line."""
    limit = sys.get_int_max_str_digits()
    for found in re.finditer(r"[0-9](?:_?[0-9])*", text):
        digits = len(found.group().replace("_", ""))
        if digits > limit:
            return f"{long_integer(digits)} (line {text.count(chr(10), 0, found.start()) + 1})"
    return f"an integer of more than {limit} digits, where numbers take at most {limit}"


def read_config(path: Path) -> dict:
    """The TOML table of the workers.toml at `path`; one ConfigError line naming the file when
    it cannot be read (a FIFO, a device, over MAX_CONFIG bytes) or is not TOML."""
    file = path_name(path)
    text = ""
    try:
        # utf-8-sig: a byte order mark first, as editors on Windows write, is no statement.
        text = read_capped(path, MAX_CONFIG).decode("utf-8-sig")
        return tomllib.loads(text)
    except FileRefused as exc:
        raise ConfigError(f"{file}: {exc}") from None
    except FileNotFoundError:
        if path == Path(DEFAULT_CONFIG):
            hint = " (pass --config or set FAIRSCHED_CONFIG)"
        elif path == Path(os.environ.get("FAIRSCHED_CONFIG") or DEFAULT_CONFIG):
            hint = " (FAIRSCHED_CONFIG names it)"
        else:
            hint = ""
        raise ConfigError(f"{file}: no such file{hint}") from None
    except IsADirectoryError:
        inside = path / DEFAULT_CONFIG
        hint = f" (--config {path_name(inside)}?)" if inside.is_file() else ""
        raise ConfigError(f"{file}: a folder, not a workers.toml file{hint}") from None
    except PermissionError as exc:
        raise ConfigError(f"{file}: cannot read: {exc.strerror} ({who_may_read(path)})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: invalid TOML: {exc}") from None
    except ValueError:  # an integer longer than Python reads (4300 digits)
        raise ConfigError(f"{file}: invalid TOML: {_long_integer_in(text)}") from None
    except RecursionError:  # tomllib reads nested arrays and inline tables recursively
        raise ConfigError(f"{file}: invalid TOML: arrays or inline tables nested too deeply, "
                          "one inside another, to be read") from None


def load_config(path: str | os.PathLike) -> Config:
    path = Path(path)
    file = path_name(path)
    raw = read_config(path)
    base = path.resolve().parent

    top = _Section(file, "top level", raw)
    sup = _Section(file, "[supervisor]", top.get("supervisor", "table", {}))
    state_dir = base / sup.get("state_dir", "str", DEFAULT_STATE_DIR)
    lease = sup.get("lease", "number", 15.0, minimum=1, maximum=MAX_LEASE)
    supervisor = SupervisorSettings(
        state_dir=state_dir,
        shutdown_timeout=sup.get("shutdown_timeout", "number", 10.0, minimum=0),
        database=sup.get("database", "str"),
        lease=lease,
        heartbeat_interval=sup.get("heartbeat_interval", "number", min(3.0, lease / 3),
                                   minimum=MIN_INTERVAL),
        poll_interval=sup.get("poll_interval", "number", 5.0, minimum=MIN_INTERVAL),
        metrics=sup.get("metrics", "str"),
        prune_after=sup.get("prune_after", "age", minimum=1, maximum=MAX_AGE_DAYS * 86400),
        log_max_bytes=sup.get("log_max_bytes", "size", 50 << 20, minimum=0),
        log_backups=sup.get("log_backups", "int", 3, minimum=0, maximum=MAX_LOG_BACKUPS),
        web=sup.get("web", "str"),
        web_token=sup.get("web_token", "str"),
    )
    if 0 < supervisor.log_max_bytes < MIN_LOG_SIZE:
        sup.fail("log_max_bytes", f"must be 0 (never rotate) or at least 1KB, got "
                                  f"{sup.table['log_max_bytes']!r}")
    if supervisor.heartbeat_interval > lease / 3:
        # A supervisor that misses its heartbeats for 2/3 of the lease gives its jobs back.
        sup.fail("heartbeat_interval", f"must be at most a third of lease ({lease:g} s)")
    socket_path = os.fsencode(state_dir / "control" / "sock")
    if len(socket_path) > MAX_SOCKET_PATH:
        sup.fail("state_dir", f"is too deep for the control socket: "
                              f"{path_name(state_dir / 'control' / 'sock')} is "
                              f"{len(socket_path)} bytes, Unix sockets take {MAX_SOCKET_PATH}")
    if supervisor.metrics is not None:
        address = metrics_address(supervisor.metrics)
        if address is None:
            sup.fail("metrics", f"must look like 'host:port' or '[ipv6]:port' (port 0 to "
                                f"65535), got {supervisor.metrics!r}")
        _check_host(sup, "metrics", supervisor.metrics, address[0])
    _check_web(sup, supervisor)
    if supervisor.web_token is not None:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & 0o077:
            sup.fail("web_token", f"is a secret in a file other accounts can read (mode "
                                  f"{mode:04o}): `chmod 600` it, or leave web_token out for "
                                  "the token generated into state_dir")
    sup.finish()

    sc = _Section(file, "[scoring]", top.get("scoring", "table", {}))
    big = MAX_WEIGHT
    scoring = Weights(
        priority=sc.get("priority_weight", "number", 1024.0, minimum=0, maximum=big),
        age=sc.get("age_weight", "number", 16.0, above=0, maximum=big),
        rarity=sc.get("rarity_weight", "number", 500.0, minimum=0, maximum=big),
        on_demand=sc.get("on_demand_bonus", "number", 4096.0, minimum=0, maximum=big),
        on_demand_age=sc.get("on_demand_age_weight", "number", 32.0, minimum=0, maximum=big),
        tenant=sc.get("tenant_weight", "number", 16384.0, minimum=0, maximum=big),
    )
    usage_half_life = sc.get("usage_half_life", "number", 600.0, above=0, maximum=MAX_HALF_LIFE)
    if scoring.priority / scoring.age > MAX_LEVEL_SECONDS:
        sc.fail("age_weight", f"is too small beside priority_weight: one priority level would "
                              f"take {scoring.priority / scoring.age:.3g} s of waiting (at most "
                              f"{MAX_LEVEL_SECONDS:g})")
    matching = sc.get("matching", "str", "greedy")
    if matching not in ("greedy", "optimal"):
        sc.fail("matching", f"must be 'greedy' or 'optimal', got {matching!r}")
    sc.finish()

    raw_workers = top.get("worker", "list", None)
    raw_schedules = top.get("schedule", "list", [])
    raw_limits = top.get("limits", "table", {})
    top.finish()
    if raw_workers is None or not isinstance(raw_workers, list) or not raw_workers:
        raise ConfigError(f"{file}: no [[worker]] tables: define at least one worker")
    workers = []
    names: set[str] = set()
    for index, table in enumerate(raw_workers, 1):
        label = table.get("name") if isinstance(table, dict) else None
        where = f"[[worker]] {label!r}" if isinstance(label, str) else f"[[worker]] #{index}"
        workers.append(_load_worker(_Section(file, where, table), base))
    for w in workers:  # no name holds a '-': none can be another group's process name (pdf-1)
        if w.name in names:
            raise ConfigError(f"{file}: [[worker]] {w.name!r} key 'name' is a duplicate name")
        names.add(w.name)
    schedules = _load_schedules(file, raw_schedules)
    limits = _load_limits(_Section(file, "[limits]", raw_limits),
                          {t for w in workers for t in w.types})
    return Config(path=path.resolve(), supervisor=supervisor, scoring=scoring, matching=matching,
                  workers=tuple(workers), schedules=schedules, usage_half_life=usage_half_life,
                  limits=limits)


def _load_limits(sec: _Section, types: set[str]) -> dict[str, int]:
    """[limits] TYPE = N: at most N jobs of TYPE at once across every supervisor."""
    limits = {}
    for type_name in sorted(sec.table):
        if type_name not in types:
            sec.fail(type_name, "names no type a [[worker]] group here runs")
        limits[type_name] = sec.get(type_name, "int", minimum=1, maximum=MAX_LIMIT)
    return limits


def _load_worker(sec: _Section, base: Path) -> WorkerSpec:
    name = sec.get("name", "str", required=True)
    if not NAME_RE.fullmatch(name):  # not match(): "$" also matches before a final "\n"
        sec.fail("name", f"must use letters, digits, '_' and '.', not starting with '.' ('-' "
                 f"is for process names such as pdf-1), got {name!r}")
    types = sec.get("types", "strlist", required=True)
    if not types:
        sec.fail("types", "must not be empty")
    for t in types:
        problem = type_name_problem(t)
        if problem is not None:
            sec.fail("types", f"has an {problem}")
    if len(set(types)) != len(types):
        sec.fail("types", "lists a type twice")
    handler = sec.get("handler", "str")
    command = sec.get("command", "strlist")
    if (handler is None) == (command is None):
        sec.fail(None, "needs exactly one of 'handler' or 'command'")
    if handler is not None and not HANDLER_RE.fullmatch(handler):
        sec.fail("handler", f"must look like 'package.module:function', got {handler!r}")
    if command is not None:
        if not command:
            sec.fail("command", "must not be empty")
        if "/" in command[0]:  # a path, relative ones from the config's folder; else PATH
            command = [str((base / command[0]).resolve()), *command[1:]]
    # Not checked here: queue commands on another host need no handler folder, and a group
    # whose folder is missing ends `fatal` saying so, while the others run.
    cwd = base / sec.get("cwd", "str", ".")
    timeout = sec.get("timeout", "number", None, above=0)
    on_timeout = sec.get("on_timeout", "str", "retry")
    if on_timeout not in ON_TIMEOUT:
        sec.fail("on_timeout", f"must be \"retry\" or \"fail\", got {on_timeout!r}")
    processes, max_processes = _processes(sec)
    idle_timeout = sec.get("idle_timeout", "number", DEFAULT_IDLE_TIMEOUT, above=0,
                           maximum=MAX_GRACE)
    if max_processes is None and "idle_timeout" in sec.table:
        sec.fail("idle_timeout", "applies only to an autoscaled group: set processes to a "
                                 "range such as \"1..8\" or remove it")
    spec = WorkerSpec(
        name=name,
        types=tuple(types),
        handler=handler,
        command=tuple(command) if command is not None else None,
        processes=processes,
        max_processes=max_processes,
        idle_timeout=idle_timeout,
        slots=sec.get("slots", "int", 1, minimum=1),
        max_attempts=sec.get("max_attempts", "int", 3, minimum=1, maximum=2**31 - 1),
        timeout=timeout,
        on_timeout=on_timeout,
        cancel_grace=sec.get("cancel_grace", "number", 10.0, minimum=0, maximum=MAX_GRACE),
        start_timeout=sec.get("start_timeout", "number", 60.0, above=0),
        retry_backoff=sec.get("retry_backoff", "number", 1.0, minimum=0),
        max_restarts=sec.get("max_restarts", "int", 5, minimum=0),
        restart_window=sec.get("restart_window", "number", 60.0, above=0),
        max_jobs=sec.get("max_jobs", "int", None, minimum=1, maximum=2**31 - 1),
        max_rss=sec.get("max_rss", "size", None, minimum=1),
        rss_limit=sec.get("rss_limit", "size", None, minimum=1),
        env=dict(sec.get("env", "strtable", {})),
        cwd=cwd,
    )
    if spec.processes > MAX_PROCESSES:
        sec.fail("processes", f"must be <= {MAX_PROCESSES}, got {_number(spec.processes)}")
    if spec.slots > 1000:
        sec.fail("slots", f"must be <= 1000, got {_number(spec.slots)}")
    sec.finish()
    return spec


def _processes(sec: _Section) -> tuple[int, int | None]:
    """(MIN, MAX) of `processes = "MIN..MAX"`, or (N, None) of `processes = N`."""
    value = sec.table.get("processes")
    if not isinstance(value, str):
        return sec.get("processes", "int", 1, minimum=1), None
    sec.seen.add("processes")
    found = _RANGE.fullmatch(value)
    if found is None:
        sec.fail("processes", f"must be an integer or a range such as \"1..8\" (MIN..MAX), "
                              f"got {value!r}")
    low, high = int(found[1]), int(found[2])
    if low < 1:
        sec.fail("processes", f"must start at 1 or more (MIN..MAX: MIN processes always run), "
                              f"got {value!r}")
    if low > high:
        sec.fail("processes", f"must not end below its start (MIN..MAX, MIN <= MAX), "
                              f"got {value!r}")
    if high > MAX_PROCESSES:
        sec.fail("processes", f"must end at {MAX_PROCESSES} at most, got {value!r}")
    return low, high


def _load_schedules(file: str, tables: list) -> tuple[ScheduleSpec, ...]:
    schedules: list[ScheduleSpec] = []
    names: set[str] = set()
    for index, table in enumerate(tables, 1):
        label = table.get("name", table.get("type")) if isinstance(table, dict) else None
        where = f"[[schedule]] {label!r}" if isinstance(label, str) else f"[[schedule]] #{index}"
        spec = _load_schedule(_Section(file, where, table))
        if spec.name in names:
            raise ConfigError(f"{file}: {where} key 'name' is a duplicate name (two schedules "
                              f"of one type need a 'name' each)")
        names.add(spec.name)
        schedules.append(spec)
    return tuple(schedules)


def _load_schedule(sched: _Section) -> ScheduleSpec:
    type_name = sched.get("type", "str", required=True)
    problem = type_name_problem(type_name)
    if problem is not None:
        sched.fail("type", f"has an {problem}")
    # The record of its last due time is kept under this name, so it must outlive a reload.
    name = sched.get("name", "str", type_name)
    if len(name) > 200 or not name.isprintable():
        sched.fail("name", f"must be printable text of at most 200 characters, got {name!r}")
    cron = sched.get("cron", "str")
    every = sched.get("every", "age", None, minimum=1, maximum=MAX_AGE_DAYS * 86400)
    if (cron is None) == (every is None):
        sched.fail(None, "needs exactly one of 'cron' (such as \"0 * * * *\") or 'every' "
                       "(such as \"30s\")")
    if cron is not None:
        problem = cron_problem(cron)
        if problem is not None:
            sched.fail("cron", problem)
    priority = sched.get("priority", "int", 0, minimum=0, maximum=10)
    payload = sched.get("payload", "table", None)
    tenant = sched.get("tenant", "str", None)
    if tenant is not None and tenant_name_problem(tenant) is not None:
        sched.fail("tenant", f"has an {tenant_name_problem(tenant)}")
    sched.finish()
    try:  # the rules every enqueued job follows

        job_row({"type": type_name, "payload": payload, "priority": priority})
    except ValueError as exc:
        sched.fail("payload", f"cannot be enqueued: {exc}")
    return ScheduleSpec(name=name, type=type_name, cron=cron, every=every, payload=payload,
                        priority=priority, tenant=tenant)


CRON_FIELDS = ("minute", "hour", "day of month", "month", "day of week")


def cron_problem(expression: str) -> str | None:
    """What is wrong with a 5-field cron expression, naming the field, or None."""
    from croniter import croniter  # imported here: only configs with schedules need it

    fields = expression.split()
    if len(fields) != len(CRON_FIELDS):
        return (f"must have 5 fields ({', '.join(CRON_FIELDS)}), got {len(fields)} in "
                f"{expression!r}")
    for position, (field_name, text) in enumerate(zip(CRON_FIELDS, fields, strict=True)):
        # Each field alone, the others '*', so the message names the one at fault.
        alone = " ".join(text if i == position else "*" for i in range(len(CRON_FIELDS)))
        if not croniter.is_valid(alone):
            return f"has a bad {field_name} field (field {position + 1}): {text!r}"
    if not croniter.is_valid(expression):
        return f"is not a valid cron expression: {expression!r}"
    return None
