"""The dashboard's reads and actions on the job table: through fairsched.Queue, on a connection
of the dashboard's own, in a thread of its own. The actor's connections and loop never wait
for a page; a database that does not answer makes the page say so, nothing more."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
from psycopg.conninfo import conninfo_to_dict

from fairsched.logs import first_line
from fairsched.store.queue import Queue
from fairsched.supervisor.metrics import TCP_KEEPALIVES

READ_FOR = 1.0  # seconds an answer of a read is given again to whoever asks the same
MAX_READS = 64  # answers kept for that
ANSWER_WITHIN = 10.0  # seconds a request waits for the database before it is told 503
MAX_WAITING = 16  # database requests queued at once; more are told 503 at once
STATEMENT_TIMEOUT = "5s"
HISTORY_ROWS = 100_000  # the chart counts the newest jobs only, read backwards by id

# Jobs submitted and finished per minute over the last hour, by type: the newest
# HISTORY_ROWS rows of the table (by its primary key), so that a large table costs no scan.
HISTORY_SQL = f"""
WITH recent AS (
    SELECT type, created_at, finished_at, status FROM fairsched_jobs
     ORDER BY id DESC LIMIT {HISTORY_ROWS})
SELECT type, 'submitted' AS what,
       extract(epoch FROM date_trunc('minute', created_at))::bigint AS minute, count(*)
  FROM recent WHERE created_at >= statement_timestamp() - interval '1 hour'
 GROUP BY 1, 2, 3
UNION ALL
SELECT type, status,
       extract(epoch FROM date_trunc('minute', finished_at))::bigint, count(*)
  FROM recent WHERE finished_at >= statement_timestamp() - interval '1 hour'
 GROUP BY 1, 2, 3
"""


class Unavailable(Exception):
    """The database did not answer, or too many requests wait for it: one line saying so."""


class WebStore:
    """One connection, one thread: requests to the database are made one at a time."""

    def __init__(self, url_of):
        self.url_of = url_of  # the queue's URL now (PostgreSQL may restart elsewhere)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fairsched-web-db")
        self.conn: psycopg.Connection | None = None
        self.conn_url: str | None = None
        self.waiting = 0
        self.reads: dict[tuple, tuple[float, asyncio.Future]] = {}
        self.lock = threading.Lock()  # the connection is closed at shutdown from the loop

    async def call(self, act):
        """act(queue) run in the dashboard's thread; its answer, or Unavailable."""
        if self.waiting >= MAX_WAITING:
            raise Unavailable(f"{MAX_WAITING} requests are waiting for the database already; "
                              "try again")
        self.waiting += 1
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self.executor, self._run, act)
            return await asyncio.wait_for(future, ANSWER_WITHIN)
        except TimeoutError:
            raise Unavailable(f"no answer from the database within {ANSWER_WITHIN:g} s") from None
        finally:
            self.waiting -= 1

    async def read(self, key: tuple, act):
        """act(queue) as `call`, its answer shared for READ_FOR seconds by the requests with
        the same `key`: pages polling the same listing cost one query, not one each."""
        now = time.monotonic()
        kept = self.reads.get(key)
        if kept is None or now - kept[0] >= READ_FOR:
            if len(self.reads) >= MAX_READS:
                self.reads = {k: v for k, v in self.reads.items() if now - v[0] < READ_FOR}
            future = asyncio.ensure_future(self.call(act))
            # Taken even when every request that asked has gone (hung up): no warning.
            future.add_done_callback(lambda f: f.cancelled() or f.exception())
            kept = (now, future)
            self.reads[key] = kept
        try:
            return await asyncio.shield(kept[1])
        except Exception:
            if self.reads.get(key) is kept:  # a failure is not given again
                del self.reads[key]
            raise

    def changed(self) -> None:
        """An action changed the table: the answers kept are read again."""
        self.reads.clear()

    def _run(self, act):
        with self.lock:
            try:
                return act(Queue(self._connection()))
            except psycopg.OperationalError as exc:
                self._close()  # the next request connects again
                raise Unavailable(f"the database: {first_line(exc)}") from None

    def _connection(self) -> psycopg.Connection:
        url = self.url_of()
        if url is None:
            raise Unavailable("the supervisor has no database yet")
        if self.conn is None or self.conn.closed or self.conn_url != url:
            self._close()
            given = conninfo_to_dict(url)
            keepalives = {k: v for k, v in TCP_KEEPALIVES.items() if k not in given}
            self.conn = psycopg.connect(url, autocommit=True, connect_timeout=3,
                                        application_name="fairsched web", **keepalives)
            self.conn_url = url
            self.conn.execute(f"SET statement_timeout = '{STATEMENT_TIMEOUT}'")
        return self.conn

    def _close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except psycopg.Error:
                pass
            self.conn = None

    def close(self) -> None:
        """Stop taking requests; the connection closes once the one running (if any) ends."""
        self.executor.submit(self._close_locked)
        self.executor.shutdown(wait=False, cancel_futures=True)

    def _close_locked(self) -> None:
        with self.lock:
            self._close()


def history(queue: Queue) -> list[tuple]:
    """(type, what, minute, count) rows: what is 'submitted' or the status a job finished in."""
    return queue.conn.execute(HISTORY_SQL).fetchall()
