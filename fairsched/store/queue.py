"""The synchronous queue API for applications and the command line: enqueue, inspect, retry, cancel.

`Queue(conn)` works inside the caller's transactions: with a connection that is not in
autocommit mode, an enqueued job exists once the caller commits, together with its own data.
"""

from __future__ import annotations

import decimal
import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from fairsched.protocol import MAX_DEPTH, MAX_PAYLOAD, json_depth
from fairsched.store.database import Database, chosen_url, open_database
from fairsched.store.errors import (
    DatabaseUnavailable,
    JobNotFound,
    JobStateError,
    OtherDatabase,
)
from fairsched.store.schema import MAX_DELAY, MAX_PRIORITY, STATUSES

# payload and result come as text, decoded by _job: a value nested too deeply to decode (one
# written by hand) must not make every listing that includes it fail.
JOB_COLUMNS = (
    "id, type, priority, payload::text AS payload, status, attempts, max_attempts, created_at,"
    " run_after, started_at, finished_at, last_error, result::text AS result, claimed_by,"
    " idempotency_key, cancel_requested, claims"
)
JOB_FIELDS = frozenset({"type", "payload", "priority", "max_attempts", "delay", "key"})
INT4_MAX = 2**31 - 1
INT8_MAX = 2**63 - 1
MAX_KEY = 1000  # bytes of an idempotency key

# One statement per batch, timed from the statement, not from the start of the caller's
# transaction (now()): a job enqueued late in a long transaction neither starts older than
# it is nor has its delay cut short. Ids are drawn before the insert so every input row, inserted or
# not, is matched to its id by position; a row whose key names an unfinished job gets that
# job's id instead (seen in the statement's snapshot, taken before the insert). Rows go in
# in key order: each waits on an unfinished insert of its key, and batches sharing keys in
# different orders would otherwise wait on each other (a deadlock); ids stay in input order.
ENQUEUE_SQL = """
WITH input AS MATERIALIZED (
    SELECT nextval('fairsched_jobs_id_seq') AS id, u.*
      FROM unnest(%(types)s::text[], %(priorities)s::smallint[], %(payloads)s::jsonb[],
                  %(max_attempts)s::integer[], %(delays)s::float8[], %(keys)s::text[])
           WITH ORDINALITY AS u(type, priority, payload, max_attempts, delay, key, ord)
), inserted AS (
    INSERT INTO fairsched_jobs
           (id, type, priority, payload, max_attempts, created_at, run_after, idempotency_key)
    OVERRIDING SYSTEM VALUE
    SELECT id, type, priority, payload, max_attempts, statement_timestamp(),
           statement_timestamp() + delay * interval '1 second', key
      FROM input ORDER BY key COLLATE "C", ord
    ON CONFLICT (idempotency_key)
       WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'running')
       DO NOTHING
    RETURNING id
)
SELECT input.ord, coalesce(inserted.id, existing.id)
  FROM input
  LEFT JOIN inserted ON inserted.id = input.id
  LEFT JOIN fairsched_jobs existing
         ON inserted.id IS NULL AND existing.idempotency_key = input.key
        AND existing.status IN ('pending', 'running')
 ORDER BY input.ord
"""


class Queue:
    """Enqueue and manage jobs; use as a context manager or call close()."""

    def __init__(self, conn: psycopg.Connection, *, database: Database | None = None):
        self.conn = conn
        self._database = database

    @classmethod
    def open(cls, where: Path | str, url: str | None = None, *, create: bool = False,
             config_file: Path | str | None = None) -> Queue:
        """Open the database of a supervisor and own the connection: `where` is its
        workers.toml (its state_dir and `database` setting) or its state_dir. `url` (and
        FAIRSCHED_DATABASE_URL before it) names an external database instead of the
        embedded one. A state_dir that does not exist is an error unless `create`: a typo
        would otherwise start an empty database no supervisor reads. `config_file`: the
        workers.toml that `url` comes from, named in errors."""
        path = Path(where)
        # A file is a workers.toml (one that is not there, if so named: a clear error); never
        # so with `create`, which the CLI passes a config's state_dir with.
        if not create and (path.is_file() or (path.suffix == ".toml" and not path.exists())):
            from fairsched.config import load_config

            config = load_config(path)
            if not url:
                url, config_file = config.supervisor.database, path
            path = config.supervisor.state_dir
        elif not (create or (path / "pg").is_dir() or chosen_url(url, config_file)):
            raise DatabaseUnavailable(
                f"{path}: no embedded database here; give the supervisor's workers.toml (it "
                "names the database), or the state_dir of one that uses the embedded database")
        if not chosen_url(url, config_file):
            refuse_beside_an_external_supervisor(path, config_file)
        database = open_database(path, url, config_file)
        try:
            conn = database.connect()
        except BaseException:
            database.close()
            raise
        return cls(conn, database=database)

    def close(self) -> None:
        """Close what open() opened; a connection passed in stays the caller's."""
        database, self._database = self._database, None
        if database is not None:
            try:
                self.conn.close()
            finally:
                database.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- enqueue ------------------------------------------------------------------------------

    def enqueue(self, type: str, payload: Any = None, *, priority: int = 0,
                max_attempts: int | None = None, delay: float = 0.0,
                key: str | None = None) -> int:
        """Add one job; with `key`, return the unfinished job holding that key if there is one."""
        return self.enqueue_many([{"type": type, "payload": payload, "priority": priority,
                                   "max_attempts": max_attempts, "delay": delay, "key": key}])[0]

    def enqueue_many(self, jobs: Iterable[Mapping[str, Any]]) -> list[int]:
        """Add jobs in one round trip; the ids come back in input order."""
        jobs = list(jobs)
        rows = [job_row(job, i, len(jobs) > 1) for i, job in enumerate(jobs)]
        if not rows:
            return []
        # A key repeated within the batch names one job: the first occurrence.
        first_of_key: dict[str, int] = {}
        alias: dict[int, int] = {}
        batch: list[int] = []
        for i, row in enumerate(rows):
            key = row[5]
            if key is not None and key in first_of_key:
                alias[i] = first_of_key[key]
                continue
            if key is not None:
                first_of_key[key] = i
            batch.append(i)
        ids: dict[int, int] = {}
        for _ in range(5):
            found = self._insert([rows[i] for i in batch])
            for position, job_id in zip(batch, found, strict=True):
                if job_id is not None:
                    ids[position] = job_id
            # A key left unresolved raced with a job that finished or started meanwhile.
            batch = [i for i in batch if i not in ids]
            if not batch:
                break
        else:
            raise JobStateError("could not enqueue: idempotency keys kept changing hands, try again")
        return [ids[alias.get(i, i)] for i in range(len(rows))]

    def _insert(self, rows: list[tuple]) -> list[int | None]:
        columns = list(zip(*rows, strict=True))
        params = dict(zip(("types", "priorities", "payloads", "max_attempts", "delays", "keys"),
                          (list(c) for c in columns), strict=True))
        # A statement of its own (autocommit, no transaction open) can be run again if a
        # caller's transaction deadlocked with it; inside a transaction the caller decides.
        alone = (self.conn.autocommit
                 and self.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)
        for attempt in range(3):
            try:
                result = self.conn.execute(ENQUEUE_SQL, params).fetchall()
                break
            except psycopg.errors.DeadlockDetected:
                if not alone or attempt == 2:
                    raise
        return [job_id for _, job_id in result]

    # -- inspect ------------------------------------------------------------------------------

    def list_jobs(self, status: str | None = None, type: str | None = None,
                  limit: int = 100) -> list[dict]:
        """The newest jobs first, optionally of one status and one type."""
        if status is not None and status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        if type is not None and not _is_text(type):
            raise ValueError(f"type must be non-empty text (UTF-8, no NUL), got {type!r}")
        if not _is_int(limit) or not 1 <= limit <= INT8_MAX:
            raise ValueError(f"limit must be an integer from 1 to {INT8_MAX}, got {limit!r}")
        where, params = [], []
        if status is not None:
            where.append("status = %s")
            params.append(status)
        if type is not None:
            where.append("type = %s")
            params.append(type)
        sql = f"SELECT {JOB_COLUMNS} FROM fairsched_jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT %s"
        params.append(limit)
        with self.conn.cursor(row_factory=dict_row) as cur:
            return [_job(row) for row in cur.execute(sql, params)]

    def same_job(self, id: int, type: str, payload: Any, priority: int) -> bool:
        """Whether job `id` has this type, payload and priority; payloads compare as jsonb
        does (1e23 and 100000000000000000000000 are one number)."""
        _check_id(id)
        row = self.conn.execute(
            "SELECT type = %s AND priority = %s AND payload IS NOT DISTINCT FROM %s::jsonb"
            " FROM fairsched_jobs WHERE id = %s",
            (type, priority, encode_json(payload, "payload"), id)).fetchone()
        return bool(row and row[0])

    def get_job(self, id: int) -> dict | None:
        """One job by id (payload and result decoded; one too deep to decode stays JSON text)."""
        _check_id(id)
        with self.conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(
                f"SELECT {JOB_COLUMNS} FROM fairsched_jobs WHERE id = %s", (id,)).fetchone()
        return _job(row) if row is not None else None

    # -- manage -------------------------------------------------------------------------------

    def retry_job(self, id: int) -> None:
        """A failed or cancelled job becomes pending again, with its attempts reset."""
        _check_id(id)
        try:
            with self.conn.transaction():
                row = self.conn.execute(
                    "UPDATE fairsched_jobs SET status = 'pending', attempts = 0,"
                    " last_error = NULL, result = NULL, run_after = now(), started_at = NULL,"
                    " finished_at = NULL, claimed_by = NULL, cancel_requested = false"
                    " WHERE id = %s AND status IN ('failed', 'cancelled') RETURNING type",
                    (id,)).fetchone()
                if row is None:
                    status = self._status(id)
                    raise JobStateError(
                        f"job {id} {'has succeeded' if status == 'succeeded' else 'is ' + status};"
                        " only failed or cancelled jobs can be retried")
                self.conn.execute("SELECT pg_notify('fairsched_jobs', %s)", (row[0],))
        except psycopg.errors.UniqueViolation:
            holder = self.conn.execute(
                "SELECT o.id, o.status FROM fairsched_jobs j JOIN fairsched_jobs o"
                " ON o.idempotency_key = j.idempotency_key AND o.id <> j.id"
                " AND o.status IN ('pending', 'running') WHERE j.id = %s", (id,)).fetchone()
            other = f"job {holder[0]} ({holder[1]})" if holder else "another unfinished job"
            raise JobStateError(
                f"job {id} cannot be retried: {other} now holds its idempotency key") from None

    def cancel_job(self, id: int) -> str:
        """Cancel a job: 'cancelled' if it was pending; 'running' if its supervisor was asked to.

        A running job keeps running until its supervisor has told the worker to stop; the
        supervisor then marks it cancelled.
        """
        _check_id(id)
        row = self.conn.execute(
            "WITH cancelled AS ("
            " UPDATE fairsched_jobs SET"
            "  status = CASE WHEN status = 'pending' THEN 'cancelled' ELSE status END,"
            "  finished_at = CASE WHEN status = 'pending' THEN now() ELSE finished_at END,"
            "  cancel_requested = (status = 'running')"
            " WHERE id = %s AND status IN ('pending', 'running')"
            " RETURNING id, status)"
            " SELECT status, CASE WHEN status = 'running'"
            "  THEN pg_notify('fairsched_cancel', id::text) END FROM cancelled",
            (id,)).fetchone()
        if row is None:
            status = self._status(id)
            raise JobStateError(f"job {id} already {status}; only unfinished jobs can be cancelled")
        return row[0]

    def _status(self, id: int) -> str:
        row = self.conn.execute("SELECT status FROM fairsched_jobs WHERE id = %s", (id,)).fetchone()
        if row is None:
            raise JobNotFound(id)
        return row[0]


STARTING_WITHIN = 15.0  # seconds a supervisor just started has to say which database it uses


def refuse_beside_an_external_supervisor(state_dir: Path,
                                         config_file: str | os.PathLike | None) -> None:
    """OtherDatabase when a supervisor runs on `state_dir` with an external database: the
    embedded one a queue would open there (starting it, or one left from an earlier setup)
    is read by no supervisor. Asks the supervisor (one round trip when one runs)."""
    from fairsched.config import control_socket_in
    from fairsched.control_client import ControlClient, NoAnswer, NotRunning, lock_holder

    socket_path = control_socket_in(state_dir)
    deadline = time.monotonic() + STARTING_WITHIN
    while True:
        try:
            ps = ControlClient(socket_path, timeout=2.0).ps()["supervisor"]
        except (NotRunning, NoAnswer, OSError, ValueError, KeyError, TypeError):
            ps = None
        kind = ps.get("database") if isinstance(ps, dict) else None
        if kind == "external":
            where = f"`[supervisor] database` in {config_file}" if config_file else "Queue.open's url"
            raise OtherDatabase(
                f"the supervisor (pid {ps.get('pid', '?')}) on {state_dir} uses an external "
                f"database; give this command its URL with FAIRSCHED_DATABASE_URL or {where}")
        if kind == "embedded" or (Path(state_dir) / "pg").exists():
            return  # the embedded database here is the supervisor's (or there is none)
        pid = lock_holder(socket_path.parent)
        if pid is None:  # no supervisor: the embedded database is this state_dir's
            return
        if time.monotonic() >= deadline:
            raise DatabaseUnavailable(
                f"the supervisor (pid {pid}) on {state_dir} has not said which database it uses"
                " (starting, or stalled); try again, or give this command the database's URL"
                " with FAIRSCHED_DATABASE_URL")
        time.sleep(0.1)


def job_row(job: Mapping[str, Any], index: int = 0, several: bool = False) -> tuple:
    """Validate one job description; return (type, priority, payload_json, max_attempts, delay,
    key). Every error names the job by its `index` when it is one of `several`."""
    try:
        return _job_row(job, index)
    except ValueError as exc:
        message = str(exc)
        if not several or message.startswith(f"job {index}: "):
            raise
        if message.startswith("job type "):
            message = message[len("job "):]
        raise ValueError(f"job {index}: {message}") from None


def _job_row(job: Mapping[str, Any], index: int) -> tuple:
    if not isinstance(job, Mapping):
        raise ValueError(f"job {index}: expected a mapping of job fields, got {_kind(job)}")
    unknown = set(job) - JOB_FIELDS
    if unknown:
        raise ValueError(f"job {index}: unknown field {sorted(unknown)[0]!r}"
                         f" (known: {', '.join(sorted(JOB_FIELDS))})")
    if "type" not in job:
        raise ValueError(f"job {index}: 'type' is required")
    type_ = job["type"]
    if not _is_text(type_):
        raise ValueError(f"job type must be non-empty text (UTF-8, no NUL), got {type_!r}")
    priority = job.get("priority", 0)
    if not _is_int(priority) or not 0 <= priority <= MAX_PRIORITY:
        raise ValueError(f"priority must be an integer from 0 to {MAX_PRIORITY}, got {priority!r}")
    max_attempts = job.get("max_attempts")
    if max_attempts is not None and (not _is_int(max_attempts)
                                     or not 1 <= max_attempts <= INT4_MAX):
        raise ValueError(f"max_attempts must be an integer from 1 to {INT4_MAX},"
                         f" got {max_attempts!r}")
    delay = job.get("delay", 0.0)
    # Compared, not math.isfinite(): an int too large for a float would raise OverflowError.
    # NaN fails the comparison too.
    if (not isinstance(delay, int | float) or isinstance(delay, bool)
            or not 0 <= delay <= MAX_DELAY):
        raise ValueError(f"delay must be a number of seconds from 0 to {MAX_DELAY:.0f},"
                         f" got {delay!r}")
    key = job.get("key")
    if key is not None and not _is_text(key):
        raise ValueError(f"key must be non-empty text (UTF-8, no NUL), got {key!r}")
    if key is not None and len(key.encode()) > MAX_KEY:  # the unique index takes no more
        raise ValueError(f"key is {len(key.encode())} bytes; at most {MAX_KEY}")
    payload = encode_json(job.get("payload"), "payload")
    size = stored_size(payload, job.get("payload"))
    if size > MAX_PAYLOAD:
        grown = number_growth(payload)
        how = (f" once its numbers are written out in full, as PostgreSQL stores them"
               f" ({size - grown} as compact JSON)" if grown > 0 else "")
        raise ValueError(f"payload is {size} bytes of JSON{how}; at most {MAX_PAYLOAD} fit in"
                         " the frame that takes a job to its worker (pass a path or a URL instead)")
    if payload is not None and json_depth(payload) > MAX_DEPTH:
        raise ValueError(f"payload nests deeper than {MAX_DEPTH} levels")
    return (type_, priority, payload, max_attempts, float(delay), key)


# A \u0000 escape in JSON text: one not itself escaped, after an even run of backslashes.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def encode_json(value: Any, what: str) -> str | None:
    """JSON text PostgreSQL's jsonb accepts, or None for SQL NULL."""
    if value is None:
        return None
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except RecursionError:
        raise ValueError(f"{what} nests too deeply to be JSON") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not JSON-serialisable: {exc}") from None
    if "\\u0000" in text and _NUL_ESCAPE.search(text):  # not a backslash before "u0000"
        raise ValueError(f"{what} contains a NUL character, which PostgreSQL jsonb cannot store")
    if "\\ud" in text or "\\uD" in text:  # surrogates: jsonb takes them only in valid pairs
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{what} contains a lone surrogate (a broken UTF-16 pair), which "
                             "PostgreSQL jsonb cannot store") from None
    return text


def stored_size(text: str | None, value: Any) -> int:
    """Bytes of `value`'s JSON `text` (as encode_json writes it) as PostgreSQL prints it back
    into a run frame, spaces aside: UTF-8, where the text escapes every non-ASCII character."""
    if text is None:
        return 0
    size = len(text)
    if "\\u" in text:  # maybe an escaped non-ASCII character: 6 or 12 bytes here, 2 to 4 there
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
    return size + number_growth(text)


_EXPONENT = re.compile(r"[0-9][eE]")


def number_growth(text: str) -> int:
    """How many bytes longer the numbers in JSON `text` print once jsonb has stored them:
    as numeric, written out in full (1e+308 comes back as 309 digits)."""
    if not _EXPONENT.search(text):  # only a number with an exponent grows
        return 0
    grown = 0

    def number(token: str) -> float:
        nonlocal grown
        if "e" in token or "E" in token:
            grown += len(format(decimal.Decimal(token), "f")) - len(token)
        return 0.0

    try:
        json.loads(text, parse_float=number)
    except RecursionError:
        return 0  # too deep for a payload anyway: refused as such
    return grown


def storable_text(text: str) -> str:
    """`text` as a PostgreSQL text column takes it: NUL and lone surrogates spelled out."""
    if "\x00" in text:
        text = text.replace("\x00", "\\0")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _job(row: dict) -> dict:
    for column in ("payload", "result"):
        if row[column] is not None:
            try:
                row[column] = json.loads(row[column])
            except RecursionError:
                pass  # shown as the JSON text it is
    return row


def _check_id(id: Any) -> None:
    if not _is_int(id) or id < 1:
        raise ValueError(f"job id must be a positive integer, got {id!r}")


def _is_text(value: Any) -> bool:
    """A non-empty string a PostgreSQL text column takes as it is (no NUL, valid UTF-8)."""
    if not isinstance(value, str) or not value or "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, e.g. from an argument that was not UTF-8
        return False
    return True


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return type(value).__name__
