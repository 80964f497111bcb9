"""The synchronous queue API for applications and the command line: enqueue, inspect, retry, cancel.

`Queue(conn)` works inside the caller's transactions: with a connection that is not in
autocommit mode, an enqueued job exists once the caller commits, together with its own data.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from fairsched.errors import path_name
from fairsched.logs import printable_line
from fairsched.store.database import EXTERNAL_MARK, Database, chosen_url, open_database
from fairsched.store.errors import (
    DatabaseUnavailable,
    JobNotFound,
    JobStateError,
    KeyConflict,
    OtherDatabase,
)
from fairsched.store.rows import (
    INT4_MAX,
    INT8_MAX,
    decode_result,
    encode_json,
    is_int,
    is_text,
    job_row,
)
from fairsched.store.schema import FINISHED, RETRIABLE, STATUSES, UNFINISHED

# payload and result come as text, decoded by _job: a value nested too deeply to decode (one
# written by hand) must not make every listing that includes it fail.
JOB_COLUMNS = (
    "id, type, priority, payload::text AS payload, status, attempts, max_attempts, created_at,"
    " run_after, started_at, finished_at, last_error, result::text AS result, claimed_by,"
    " idempotency_key, cancel_requested, claims, tenant"
)


# What retrying sets: a job pending again with its attempts reset, and the max_attempts it
# was given (at enqueue, or from its worker group at its first claim) unless a new budget.
RETRY_SET = """status = 'pending', attempts = 0, last_error = NULL, result = NULL,
       run_after = now(), started_at = NULL, finished_at = NULL, claimed_by = NULL,
       cancel_requested = false, max_attempts = coalesce(%(max_attempts)s, max_attempts)"""

# retry_jobs: the jobs in a status, of a type or of all, pending again as retry_job makes one.
# A job whose idempotency key an unfinished job holds stays as it is, and of those in the
# status sharing a key only the newest is retried: two unfinished jobs cannot hold one key.
RETRY_ALL_SQL = f"""
WITH chosen AS (
    SELECT id, idempotency_key,
           row_number() OVER (PARTITION BY idempotency_key ORDER BY id DESC) AS newest
      FROM fairsched_jobs
     WHERE status = %(status)s AND (%(type)s::text IS NULL OR type = %(type)s))
UPDATE fairsched_jobs AS j SET {RETRY_SET}
  FROM chosen
 WHERE j.id = chosen.id AND j.status = %(status)s
   AND (chosen.idempotency_key IS NULL OR (
        chosen.newest = 1
        AND NOT EXISTS (SELECT 1 FROM fairsched_jobs AS o
                         WHERE o.idempotency_key = chosen.idempotency_key
                           AND o.status IN ('pending', 'running'))))
RETURNING j.id, j.type
"""

DEPTH_SQL = """
SELECT type, count(*) FILTER (WHERE status = 'pending') AS pending,
       count(*) FILTER (WHERE status = 'pending' AND run_after > now()) AS delayed,
       count(*) FILTER (WHERE status = 'running') AS running,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       extract(epoch FROM now() - min(run_after)
               FILTER (WHERE status = 'pending' AND run_after <= now()))::float8 AS oldest_wait
  FROM fairsched_jobs
 WHERE status IN ('pending', 'running', 'failed') AND (%(type)s::text IS NULL OR type = %(type)s)
 GROUP BY type ORDER BY type
"""

PRUNE_BATCH = 10_000  # rows one statement of prune_jobs deletes


def _cancel_sql(where: str) -> str:
    """The jobs matching `where` cancelled: pending ones end cancelled; running ones get
    their cancel asked for, and their supervisors the notification that passes it on.
    Returns each one's id and its status now ('cancelled', or 'running' until its
    supervisor has stopped it)."""
    return f"""
WITH cancelled AS (
    UPDATE fairsched_jobs SET
        status = CASE WHEN status = 'pending' THEN 'cancelled' ELSE status END,
        finished_at = CASE WHEN status = 'pending' THEN now() ELSE finished_at END,
        cancel_requested = (status = 'running')
     WHERE {where}
    RETURNING id, status)
SELECT id, status, CASE WHEN status = 'running' THEN pg_notify('fairsched_cancel', id::text) END
  FROM cancelled
"""


# cancel_jobs: every job in a status (of a type or of all) not asked to stop already.
CANCEL_ALL_SQL = _cancel_sql("status = %(status)s AND (%(type)s::text IS NULL OR type = %(type)s)"
                             " AND NOT cancel_requested")
CANCEL_ONE_SQL = _cancel_sql("id = %(id)s AND status IN ('pending', 'running')")

# One statement per batch, timed from the statement, not from the start of the caller's
# transaction (now()): a job enqueued late in a long transaction neither starts older than
# it is nor has its delay cut short. Ids are drawn before the insert so every input row, inserted or
# not, is matched to its id by position. A row whose key names a job gets that job's id: an
# unfinished one in the table (seen in the statement's snapshot, taken before the insert),
# else the first row of the batch with that key; `same` says whether it is the same job (type,
# payload as jsonb compares it, priority), and when any row is not, nothing is inserted and
# the job its key names is described. Rows go in in key order: each waits on an unfinished
# insert of its key, and batches sharing keys in different orders would otherwise wait on
# each other (a deadlock); ids stay in input order.
ENQUEUE_SQL = """
WITH input AS MATERIALIZED (
    SELECT nextval('fairsched_jobs_id_seq') AS id, u.*
      FROM unnest(%(types)s::text[], %(priorities)s::smallint[], %(payloads)s::jsonb[],
                  %(max_attempts)s::integer[], %(delays)s::float8[], %(keys)s::text[],
                  %(tenants)s::text[])
           WITH ORDINALITY AS u(type, priority, payload, max_attempts, delay, key, tenant, ord)
), named AS MATERIALIZED (
    SELECT i.ord, i.first_ord, first.id AS first_id, held.id AS held_id,
           coalesce(held.type, first.type) AS type,
           coalesce(held.priority, first.priority) AS priority,
           CASE WHEN held.id IS NULL THEN first.payload ELSE held.payload END AS payload,
           coalesce(held.type, first.type) = i.type
           AND coalesce(held.priority, first.priority) = i.priority
           AND (CASE WHEN held.id IS NULL THEN first.payload ELSE held.payload END)
               IS NOT DISTINCT FROM i.payload AS same
      FROM (SELECT *, CASE WHEN key IS NULL THEN ord
                           ELSE min(ord) OVER (PARTITION BY key) END AS first_ord
              FROM input) AS i
      JOIN input AS first ON first.ord = i.first_ord
      LEFT JOIN fairsched_jobs AS held
             ON held.idempotency_key = i.key AND held.status IN ('pending', 'running')
), inserted AS (
    INSERT INTO fairsched_jobs
           (id, type, priority, payload, max_attempts, created_at, run_after, idempotency_key,
            tenant)
    OVERRIDING SYSTEM VALUE
    SELECT input.id, input.type, input.priority, input.payload, input.max_attempts,
           statement_timestamp(), statement_timestamp() + input.delay * interval '1 second',
           input.key, input.tenant
      FROM input JOIN named ON named.ord = input.ord
     WHERE named.ord = named.first_ord AND named.held_id IS NULL
       AND NOT EXISTS (SELECT 1 FROM named WHERE NOT named.same)
     ORDER BY input.key COLLATE "C", input.ord
    ON CONFLICT (idempotency_key)
       WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'running')
       DO NOTHING
    RETURNING id
)
SELECT named.ord, coalesce(named.held_id, inserted.id), named.same, named.held_id,
       named.first_ord,
       CASE WHEN NOT named.same THEN named.type END,
       CASE WHEN NOT named.same THEN named.priority END,
       CASE WHEN NOT named.same THEN left(named.payload::text, 60) END
  FROM named
  LEFT JOIN inserted ON inserted.id = named.first_id
 ORDER BY named.ord
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
                f"{path_name(path)}: no embedded database here; give the supervisor's "
                "workers.toml (it names the database), or the state_dir of one that uses the "
                "embedded database")
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
                key: str | None = None, tenant: str | None = None) -> int:
        """Add one job; with `key`, return the unfinished job holding that key if it is this
        same job (type, payload, priority), and raise KeyConflict if it is another. `tenant`
        names who it is for (None: the default tenant), for the fair share between tenants."""
        return self.enqueue_many([{"type": type, "payload": payload, "priority": priority,
                                   "max_attempts": max_attempts, "delay": delay, "key": key,
                                   "tenant": tenant}])[0]

    def enqueue_many(self, jobs: Iterable[Mapping[str, Any]]) -> list[int]:
        """Add jobs in one round trip; the ids come back in input order. A key repeated in
        the call names one job, the first with it; KeyConflict when a job's key is held by
        another job (unfinished in the table, or earlier in the call), and then nothing at all
        is queued."""
        jobs = list(jobs)
        rows = [job_row(job, i, len(jobs) > 1) for i, job in enumerate(jobs)]
        if not rows:
            return []
        # A statement of its own (autocommit, no transaction open) can be run again if a
        # caller's transaction deadlocked with it; inside a transaction the caller decides.
        alone = (self.conn.autocommit
                 and self.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)
        # Without keys the one statement is the whole call; with them, a key taken meanwhile
        # takes a second look after the first statement has written the rest.
        keyed = any(row[5] is not None for row in rows)
        for attempt in range(3):
            try:
                with self._all_or_nothing() if keyed else contextlib.nullcontext():
                    return self._enqueue(rows, len(rows) > 1)
            except psycopg.errors.DeadlockDetected:
                if not alone or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def _all_or_nothing(self):
        """What the block writes is kept only if it ends without an error: a transaction of
        its own in autocommit mode, a savepoint in the caller's transaction. On a connection
        not in autocommit mode with no transaction open, the one the block's first statement
        opens holds nothing else, and the caller commits it (it is rolled back on an error):
        a transaction() block would commit it here."""
        conn = self.conn
        if conn.autocommit or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            with conn.transaction():
                yield
            return
        try:
            yield
        except BaseException:
            with contextlib.suppress(psycopg.Error):
                conn.rollback()
            raise

    def _enqueue(self, rows: list[tuple], several: bool) -> list[int]:
        ids: list[int | None] = [None] * len(rows)
        left = list(range(len(rows)))
        for _ in range(5):
            for position, (job_id, same, held_by, first, *named) in zip(
                    left, self._insert([rows[i] for i in left]), strict=True):
                if not same:
                    raise _key_conflict(rows[position][5], position, held_by,
                                        left[first - 1], named, several)
                ids[position] = job_id
            # A key left unresolved raced with a job that finished or started meanwhile.
            left = [i for i in left if ids[i] is None]
            if not left:
                return ids
        raise JobStateError("could not enqueue: idempotency keys kept changing hands, try again")

    def _insert(self, rows: list[tuple]) -> list[tuple]:
        columns = list(zip(*rows, strict=True))
        params = dict(zip(("types", "priorities", "payloads", "max_attempts", "delays", "keys",
                           "tenants"),
                          (list(c) for c in columns), strict=True))
        return [row[1:] for row in self.conn.execute(ENQUEUE_SQL, params).fetchall()]

    # -- inspect ------------------------------------------------------------------------------

    def list_jobs(self, status: str | None = None, type: str | None = None,
                  limit: int = 100) -> list[dict]:
        """The newest jobs first, optionally of one status and one type."""
        if status is not None and status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        _check_type(type)
        if not is_int(limit) or not 1 <= limit <= INT8_MAX:
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

    def depth(self, type: str | None = None) -> list[dict]:
        """By type (of `type` if given): how many jobs are pending (and of those, delayed),
        running and failed, and how long the oldest pending one that may run has waited
        (None when none does), in seconds. Finished rows other than failed ones, the whole
        history, are not counted."""
        _check_type(type)
        with self.conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(DEPTH_SQL, {"type": type}).fetchall()

    def limit_holds(self) -> dict[str, int]:
        """[limits]: the on-demand jobs holding a place, by type."""
        return dict(self.conn.execute(
            "SELECT type, count(*) FROM fairsched_limit_holds GROUP BY type").fetchall())

    def server_time(self) -> datetime:
        """The database server's clock: the one created_at and run_after are set by, which
        the host's may be minutes or hours away from."""
        return self.conn.execute("SELECT statement_timestamp()").fetchone()[0]

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
        return self.get_jobs([id]).get(id)

    def get_jobs(self, ids: Iterable[int]) -> dict[int, dict]:
        """The jobs of these ids that exist, by id, in one round trip."""
        ids = list(dict.fromkeys(ids))
        for id in ids:
            _check_id(id)
        with self.conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(f"SELECT {JOB_COLUMNS} FROM fairsched_jobs"
                               " WHERE id = ANY(%s::bigint[])", (ids,)).fetchall()
        return {row["id"]: _job(row) for row in rows}

    # -- manage -------------------------------------------------------------------------------

    def retry_jobs(self, status: str = "failed", type: str | None = None, *,
                   max_attempts: int | None = None) -> tuple[dict[int, str], list[int]]:
        """Every job in `status` ('failed' or 'cancelled'), of `type` if given, pending again in
        one statement, as retry_job makes one. Returns the type of each job retried, by id,
        and the ids left as they were: an unfinished job holds their idempotency key (or a
        newer one of them, retried now, does)."""
        if status not in RETRIABLE:
            raise ValueError(f"status must be one of {', '.join(RETRIABLE)}, got {status!r}")
        _check_type(type)
        _check_max_attempts(max_attempts)
        params = {"status": status, "type": type, "max_attempts": max_attempts}
        for _ in range(3):  # an enqueue that takes a key between our check and our write
            try:
                with self.conn.transaction():
                    retried = dict(self.conn.execute(RETRY_ALL_SQL, params).fetchall())
                    for type_name in sorted(set(retried.values())):
                        self.conn.execute("SELECT pg_notify('fairsched_jobs', %s)", (type_name,))
                    left = [row[0] for row in self.conn.execute(
                        "SELECT id FROM fairsched_jobs WHERE status = %(status)s"
                        " AND (%(type)s::text IS NULL OR type = %(type)s)"
                        " AND idempotency_key IS NOT NULL ORDER BY id", params)]
                return retried, left
            except psycopg.errors.UniqueViolation:
                continue
        raise JobStateError(f"the {status} jobs could not be retried: new jobs kept taking "
                            "their idempotency keys; try again")

    def retry_job(self, id: int, *, max_attempts: int | None = None) -> str:
        """A failed or cancelled job becomes pending again, with its attempts reset; returns
        its type. It keeps the max_attempts it was given (at enqueue, or from its worker group
        at its first claim) unless `max_attempts` gives it a new budget."""
        _check_id(id)
        _check_max_attempts(max_attempts)
        try:
            with self.conn.transaction():
                # The row is locked before its status is judged: read after a refused update
                # instead, it may have ended since ("job 5 is failed; only failed ... can be
                # retried").
                status = self._status(id, lock=True)
                if status not in ("failed", "cancelled"):
                    raise JobStateError(
                        f"job {id} {'has succeeded' if status == 'succeeded' else 'is ' + status};"
                        " only failed or cancelled jobs can be retried")
                (type_name,) = self.conn.execute(
                    f"UPDATE fairsched_jobs SET {RETRY_SET} WHERE id = %(id)s RETURNING type",
                    {"max_attempts": max_attempts, "id": id}).fetchone()
                self.conn.execute("SELECT pg_notify('fairsched_jobs', %s)", (type_name,))
            return type_name
        except psycopg.errors.UniqueViolation:
            holder = self.conn.execute(
                "SELECT o.id, o.status FROM fairsched_jobs j JOIN fairsched_jobs o"
                " ON o.idempotency_key = j.idempotency_key AND o.id <> j.id"
                " AND o.status IN ('pending', 'running') WHERE j.id = %s", (id,)).fetchone()
            other = f"job {holder[0]} ({holder[1]})" if holder else "another unfinished job"
            raise JobStateError(
                f"job {id} cannot be retried: {other} now holds its idempotency key") from None

    def prune_jobs(self, older_than: float, statuses: Iterable[str] = ("succeeded", "cancelled"),
                   type: str | None = None, *, dry_run: bool = False,
                   batch: int = PRUNE_BATCH, stop: Callable[[], bool] | None = None) -> int:
        """Delete the finished jobs in `statuses` (of `type` if given) that finished more than
        `older_than` seconds ago, by the server's clock; how many. In statements of `batch`
        rows, each its own transaction on a connection in autocommit mode, so that no lock is
        held long; `stop()`, if given, is asked after each whether to leave the rest for
        later. With `dry_run`, only count them."""
        statuses = list(statuses)
        if not statuses or any(status not in FINISHED for status in statuses):
            raise ValueError(f"statuses must be some of {', '.join(FINISHED)}, got {statuses!r}")
        if not isinstance(older_than, (int, float)) or not 0 <= older_than < float("inf"):
            raise ValueError(f"older_than must be a number of seconds >= 0, got {older_than!r}")
        _check_type(type)
        params = {"statuses": statuses, "type": type, "age": older_than, "batch": batch}
        where = ("status = ANY(%(statuses)s::text[]) AND (%(type)s::text IS NULL OR type = %(type)s)"
                 " AND finished_at < statement_timestamp() - make_interval(secs => %(age)s)")
        if dry_run:
            return self.conn.execute(
                f"SELECT count(*) FROM fairsched_jobs WHERE {where}", params).fetchone()[0]
        # In id order, each batch starting past the last: a batch never reads again the rows
        # the ones before it deleted (dead until a vacuum), so a large table takes linear time.
        deleted, params["after"] = 0, 0
        while True:
            with self.conn.transaction():
                done, last = self.conn.execute(
                    f"WITH gone AS (DELETE FROM fairsched_jobs WHERE id IN ("
                    f"   SELECT id FROM fairsched_jobs WHERE id > %(after)s AND {where}"
                    f"    ORDER BY id LIMIT %(batch)s) RETURNING id)"
                    f" SELECT count(*), max(id) FROM gone", params).fetchone()
            deleted += done
            if done < batch or (stop is not None and stop()):
                return deleted
            params["after"] = last

    def cancel_jobs(self, status: str = "pending", type: str | None = None) -> list[int]:
        """Every job in `status`, of `type` if given, cancelled in one statement, as cancel_job
        cancels one: pending ones end 'cancelled', the supervisors of running ones are asked
        to stop them (those asked already are left out). Returns their ids."""
        if status not in UNFINISHED:
            raise ValueError(f"status must be one of {', '.join(UNFINISHED)}, got {status!r}")
        _check_type(type)
        rows = self.conn.execute(CANCEL_ALL_SQL, {"status": status, "type": type})
        return sorted(row[0] for row in rows)

    def cancel_job(self, id: int) -> str:
        """Cancel a job: 'cancelled' if it was pending; 'running' if its supervisor was asked to.

        A running job keeps running until its supervisor has told the worker to stop; the
        supervisor then marks it cancelled.
        """
        _check_id(id)
        with self.conn.transaction():
            # Locked first, as in retry_job: a job a retry made pending again meanwhile is
            # cancelled, not reported "already pending".
            status = self._status(id, lock=True)
            if status not in UNFINISHED:
                raise JobStateError(
                    f"job {id} already {status}; only unfinished jobs can be cancelled")
            return self.conn.execute(CANCEL_ONE_SQL, {"id": id}).fetchone()[1]

    def _status(self, id: int, *, lock: bool = False) -> str:
        row = self.conn.execute("SELECT status FROM fairsched_jobs WHERE id = %s"
                                + (" FOR UPDATE" if lock else ""), (id,)).fetchone()
        if row is None:
            raise JobNotFound(id)
        return row[0]


def refuse_beside_an_external_supervisor(state_dir: Path,
                                         config_file: str | os.PathLike | None) -> None:
    """OtherDatabase when a supervisor runs on `state_dir` with an external database, or
    none runs and the last one there used one (it left EXTERNAL_MARK): the embedded one a
    queue would open there (starting it, or one left from an earlier setup) is read by no
    supervisor. Asks the supervisor (one round trip when one runs)."""
    from fairsched.config import control_socket_in
    from fairsched.control_client import (
        STARTING_WITHIN,
        ControlClient,
        NoAnswer,
        NotRunning,
        lock_holder,
    )

    socket_path = control_socket_in(state_dir)
    where = (f"`[supervisor] database` in {path_name(config_file)}" if config_file
             else "Queue.open's url")
    state = path_name(state_dir)
    deadline = time.monotonic() + STARTING_WITHIN
    while True:
        try:
            ps = ControlClient(socket_path, timeout=2.0, starting_within=0).ps()["supervisor"]
        except (NotRunning, NoAnswer, OSError, ValueError, KeyError, TypeError):
            ps = None
        kind = ps.get("database") if isinstance(ps, dict) else None
        if kind == "external":
            raise OtherDatabase(
                f"the supervisor (pid {ps.get('pid', '?')}) on {state} uses an external "
                f"database; give this command its URL with FAIRSCHED_DATABASE_URL or {where}")
        if kind == "embedded":
            return  # the embedded database here is the supervisor's
        mark = Path(state_dir) / EXTERNAL_MARK
        external = mark.exists()  # the last supervisor here used an external database
        if not external and (Path(state_dir) / "pg").exists():
            return  # the embedded database here is the supervisor's (or there is none)
        pid = lock_holder(socket_path.parent)
        if pid is None and external:
            raise OtherDatabase(
                f"the supervisor on {state} used an external database when it last ran; "
                f"give this command its URL with FAIRSCHED_DATABASE_URL or {where} (or remove "
                f"{path_name(mark)} to start an embedded database there)")
        if pid is None:  # no supervisor: the embedded database is this state_dir's
            return
        if time.monotonic() >= deadline:
            raise DatabaseUnavailable(
                f"the supervisor (pid {pid}) on {state} has not said which database it uses"
                " (starting, or stalled); try again, or give this command the database's URL"
                " with FAIRSCHED_DATABASE_URL")
        time.sleep(0.1)


def _job(row: dict) -> dict:
    for column in ("payload", "result"):
        if row[column] is not None:
            try:
                row[column] = json.loads(row[column])
            except (RecursionError, ValueError):
                # Too deep, or an integer longer than Python reads (4300 digits: 1e5000
                # written by hand comes back written out in full): the JSON text it is.
                continue
    if row["result"] is not None:
        row["result"] = decode_result(row["result"])  # as its handler returned it
    return row


def _key_conflict(key: str, index: int, held_by: int | None, first: int, named: list,
                  several: bool) -> KeyConflict:
    """The error for job `index` of a call, whose key `held_by` (an unfinished job) or, when
    None, job `first` of the call names; `named`: that job's type, priority and the start of
    its payload."""
    type_name, priority, payload = named
    other = (f"job {held_by}" if held_by is not None
             else f"job {first} of this call")
    return KeyConflict(
        f"{f'job {index}: ' if several else ''}key {key!r} is held by {other} "
        f"(type {type_name}, priority {priority}, payload {printable_line(payload or 'null')}), "
        f"not this job; nothing was queued", key, held_by, index)


def _check_max_attempts(max_attempts: Any) -> None:
    if max_attempts is not None and (not is_int(max_attempts)
                                     or not 1 <= max_attempts <= INT4_MAX):
        raise ValueError(f"max_attempts must be an integer from 1 to {INT4_MAX},"
                         f" got {max_attempts!r}")


def _check_type(type: Any) -> None:
    if type is not None and not is_text(type):
        raise ValueError(f"type must be non-empty text (UTF-8, no NUL), got {type!r}")


def _check_id(id: Any) -> None:
    if not is_int(id) or id < 1:
        raise ValueError(f"job id must be a positive integer, got {id!r}")
