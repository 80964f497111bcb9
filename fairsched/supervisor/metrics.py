"""Prometheus metrics for one supervisor, served over HTTP from a daemon thread.

The actor never waits on a scrape: counters and histograms are bumped from its hooks, the
slot and worker gauges come from an immutable snapshot the actor's loop refreshes twice a
second, and the queue depth is read on scrape through this exporter's own connection.
"""

from __future__ import annotations

import collections
import logging
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIRequestHandler, make_server

import psycopg
from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from psycopg.conninfo import conninfo_to_dict

from fairsched.config import metrics_address
from fairsched.logs import first_line
from fairsched.supervisor.hooks import Observer
from fairsched.supervisor.states import ProcessState
from fairsched.supervisor.status import slot_states

log = logging.getLogger("fairsched.metrics")

SNAPSHOT_INTERVAL = 0.5  # seconds between two copies of the actor's state
DEPTH_CACHE = 1.0  # seconds a queue-depth answer serves further scrapes
DEPTH_WAIT = 2.0  # seconds a scrape waits for the queue depth before calling it unknown
# A connection that sends or takes nothing this long is closed: one left idle, or whose client
# vanished without a word (a crashed host), would hold a thread and a file of the supervisor.
CLIENT_TIMEOUT = 10.0
# A TCP connection to a database that went silent fails within about 20 s instead of hanging
# (libpq ignores these for a Unix socket, where a silent server is a stopped one).
TCP_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 5,
                  "keepalives_count": 3, "tcp_user_timeout": 20000}
OUTCOMES = ("succeeded", "failed", "retried", "cancelled", "returned")
UNRECORDED_OUTCOMES = ("succeeded", "failed", "retried")  # the outcomes written under a fence
QUEUE_STATUSES = ("pending", "running", "failed")
SLOT_STATES = ("free", "busy", "starting", "stopping", "down", "fatal")  # as `ps` shows them
# The gauges built on each scrape from the snapshot and the queue depth.
STATE_GAUGES = ("fairsched_jobs_in_flight", "fairsched_slots", "fairsched_workers",
                "fairsched_on_demand_waiting", "fairsched_lease_lost", "fairsched_queue_jobs",
                "fairsched_queue_oldest_pending_seconds", "fairsched_queue_up",
                "fairsched_limit", "fairsched_limit_running")
# Waits and run times range from milliseconds (on-demand) to hours (a backlog).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600,
           1800, 3600, 7200)

# Finished rows (succeeded, cancelled) are left out: counting them scans the whole history on
# every scrape, and the job counters already tell how many finished. Each branch matches one
# partial index of the job table.
DEPTH_SQL = """
SELECT type, 'pending', count(*), extract(epoch FROM now() - min(run_after)
                                          FILTER (WHERE run_after <= now()))
  FROM fairsched_jobs WHERE status = 'pending' GROUP BY type
UNION ALL
SELECT type, 'running', count(*), NULL FROM fairsched_jobs WHERE status = 'running' GROUP BY type
UNION ALL
SELECT type, 'failed', count(*), NULL FROM fairsched_jobs WHERE status = 'failed' GROUP BY type
UNION ALL
SELECT type, 'held', count(*), NULL FROM fairsched_limit_holds GROUP BY type
"""


@dataclass(frozen=True)
class Snapshot:
    """What the gauges show, copied on the actor's loop; the HTTP thread only reads it."""

    types: tuple[str, ...] = ()
    in_flight: dict[str, int] = field(default_factory=dict)
    slots: dict[tuple[str, str], int] = field(default_factory=dict)  # (type, state) -> n
    workers: dict[tuple[str, str], int] = field(default_factory=dict)  # (group, state) -> n
    on_demand_waiting: int = 0
    lease_lost: bool = False
    limits: dict[str, int] = field(default_factory=dict)  # [limits]


def take_snapshot(sup) -> Snapshot:
    # Each slot in the state `ps` gives it at this moment, so the two agree: a stopping
    # worker's slots are `stopping`, whatever job they still run.
    slots = collections.Counter()
    for proc in sup.workers.procs:
        types = proc.life.types or proc.spec.types
        for _, state, _ in slot_states(sup, proc):
            for t in types:
                slots[(t, state)] += 1
    in_flight = dict.fromkeys(sup.planner.type_ids, 0)
    for rj in sup.jobs.running.values():
        in_flight[rj.type] = in_flight.get(rj.type, 0) + 1
    workers = collections.Counter((proc.group, proc.state.value) for proc in sup.workers.procs)
    return Snapshot(types=tuple(sorted(sup.planner.type_ids)), in_flight=in_flight, slots=dict(slots),
                    workers=dict(workers), on_demand_waiting=sup.planner.n_waiting_requests,
                    lease_lost=sup.lease.fenced, limits=dict(sup.config.limits))


class _QuietHandler(WSGIRequestHandler):
    timeout = CLIENT_TIMEOUT

    def log_message(self, format, *args):  # a scrape every few seconds is not news
        pass


class _ThreadingServer(ThreadingWSGIServer):
    """prometheus_client's own server (a thread per request, daemon threads), quieter."""

    def handle_error(self, request, client_address):
        # socketserver's own prints a traceback to stderr, where the log is: a client that
        # hangs up mid-request is not news, and anything else is one line of the log.
        exc = sys.exception()
        if isinstance(exc, OSError):
            return
        log.error("metrics: a request from %s failed: %s: %s", client_address[0],
                  type(exc).__name__, exc)


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class QueueDepth:
    """Job counts per type and status, read on scrape through a connection of its own.

    The query runs on a thread of its own, one at a time, and a scrape waits for it at most
    DEPTH_WAIT seconds: a database that does not answer (a partition, a stalled server) makes
    the depth unknown (`fairsched_queue_up` 0), it does not hold the whole scrape.
    """

    def __init__(self, url_of):
        self.url_of = url_of  # called on scrape: the URL may change when PostgreSQL restarts
        self.lock = threading.Lock()
        self.answered = threading.Condition(self.lock)
        self.querying = False  # a query thread is out; only it touches the connection
        self.conn: psycopg.Connection | None = None
        self.conn_url: str | None = None
        self.read_at = -DEPTH_CACHE
        self.rows: list[tuple] = []
        self.up = 0
        self.failing = False
        self.closed = False

    def read(self) -> tuple[list[tuple], int]:
        with self.answered:
            if self.closed:
                return [], 0
            if not self.querying and time.monotonic() - self.read_at >= DEPTH_CACHE:
                self.querying = True
                threading.Thread(target=self._run, name="fairsched-metrics-depth",
                                 daemon=True).start()
            if self.querying and not self.answered.wait_for(lambda: not self.querying,
                                                            DEPTH_WAIT):
                if not self.failing:  # one line per outage, not one per scrape
                    log.warning("metrics: cannot read the queue depth: no answer from "
                                "PostgreSQL within %g s", DEPTH_WAIT)
                self.failing = True
                return [], 0
            return self.rows, self.up

    def _run(self) -> None:
        rows, up = self._query()
        with self.answered:
            self.rows, self.up = rows, up
            self.read_at = time.monotonic()
            self.querying = False
            if self.closed:
                self._close()
            self.answered.notify_all()

    def _query(self) -> tuple[list[tuple], int]:
        try:
            rows = self._read()
            if self.failing:
                log.info("metrics: reading the queue depth again")
            self.failing = False
            return rows, 1
        except Exception as exc:  # psycopg's, or any other: the next scrape must ask again
            self._close()
            if not self.failing:  # one line per outage, not one per scrape
                log.warning("metrics: cannot read the queue depth: %s", first_line(exc))
            self.failing = True
            return [], 0

    def _read(self) -> list[tuple]:
        url = self.url_of()
        if url is None:
            raise psycopg.OperationalError("the supervisor has no database yet")
        reused = not (self.conn is None or self.conn.closed or self.conn_url != url)
        if not reused:
            self._close()
            given = conninfo_to_dict(url)  # what the URL sets itself stays
            keepalives = {k: v for k, v in TCP_KEEPALIVES.items() if k not in given}
            self.conn = psycopg.connect(url, autocommit=True, connect_timeout=3,
                                        application_name="fairsched metrics", **keepalives)
            self.conn_url = url
            self.conn.execute("SET statement_timeout = '5s'")
        try:
            return self.conn.execute(DEPTH_SQL).fetchall()
        except psycopg.OperationalError:
            if not reused:
                raise
            # The connection outlived its server (restarted, or it ended the session, since
            # the last scrape): this scrape asks once more over a new one.
            self._close()
            return self._read()

    def _close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except psycopg.Error:
                pass
            self.conn = None

    def close(self) -> None:
        with self.lock:
            self.closed = True
            if not self.querying:  # else the query thread closes the connection when it ends
                self._close()


class _StateCollector:
    """Gauges from the latest snapshot and from the queue depth, built on each scrape."""

    def __init__(self, observer: PrometheusObserver):
        self.observer = observer

    def describe(self):
        # The names alone, without samples (registration must not query the database): a
        # scrape that asks for some by name (`?name[]=fairsched_workers`) finds them here.
        return [GaugeMetricFamily(name, "") for name in STATE_GAUGES]

    def collect(self):
        snap = self.observer.snapshot
        in_flight = GaugeMetricFamily("fairsched_jobs_in_flight",
                                      "Jobs running on this supervisor's workers.", labels=["type"])
        slots = GaugeMetricFamily("fairsched_slots", "Slots able to run a type, by the state "
                                  "fairsched ps shows (a versatile slot counts for each of its "
                                  "types).",
                                  labels=["type", "state"])
        workers = GaugeMetricFamily("fairsched_workers", "Worker processes by group and "
                                    "process state.", labels=["group", "state"])
        waiting = GaugeMetricFamily("fairsched_on_demand_waiting",
                                    "On-demand requests waiting for a slot.")
        for t in snap.types:
            in_flight.add_metric([t], snap.in_flight.get(t, 0))
            for state in SLOT_STATES:
                slots.add_metric([t, state], snap.slots.get((t, state), 0))
        groups = sorted({group for group, _ in snap.workers})
        for group in groups:
            for state in ProcessState:
                workers.add_metric([group, state.value], snap.workers.get((group, state.value), 0))
        waiting.add_metric([], snap.on_demand_waiting)
        lease_lost = GaugeMetricFamily("fairsched_lease_lost", "1 while this supervisor, unable "
                                       "to renew its lease, has given its queued jobs back and "
                                       "claims none.")
        lease_lost.add_metric([], int(snap.lease_lost))
        yield from (in_flight, slots, workers, waiting, lease_lost)
        yield from self._depth(snap)

    def _depth(self, snap: Snapshot):
        rows, up = self.observer.depth.read()
        jobs = GaugeMetricFamily("fairsched_queue_jobs", "Jobs in the table by type and status "
                                 "(pending, running, failed: the dead-letter list).",
                                 labels=["type", "status"])
        oldest = GaugeMetricFamily("fairsched_queue_oldest_pending_seconds",
                                   "How long the oldest eligible pending job of a type has "
                                   "waited.", labels=["type"])
        health = GaugeMetricFamily("fairsched_queue_up", "1 when the last queue-depth query "
                                   "succeeded.")
        counts = {(t, s): 0 for t in snap.types for s in QUEUE_STATUSES} if up else {}
        ages = dict.fromkeys(snap.types, 0.0) if up else {}
        held: dict[str, int] = {}
        for type_name, status, count, age in rows:
            if status == "held":  # on-demand jobs holding a place of a limited type
                held[type_name] = count
                continue
            counts[(type_name, status)] = count
            if status == "pending":
                ages[type_name] = float(age or 0.0)
        for (type_name, status), count in sorted(counts.items()):
            jobs.add_metric([type_name, status], count)
        for type_name, age in sorted(ages.items()):
            oldest.add_metric([type_name], age)
        health.add_metric([], up)
        limit = GaugeMetricFamily("fairsched_limit", "[limits]: at most this many jobs of the "
                                  "type at once, across every supervisor.", labels=["type"])
        limit_running = GaugeMetricFamily(
            "fairsched_limit_running", "[limits]: jobs of a limited type running across every "
            "supervisor, on-demand ones included.", labels=["type"])
        for type_name, n in sorted(snap.limits.items()):
            limit.add_metric([type_name], n)
            if up:
                limit_running.add_metric([type_name], counts.get((type_name, "running"), 0)
                                         + held.get(type_name, 0))
        yield from (jobs, oldest, health, limit, limit_running)


def _serving_metrics_only(app):
    """The app at /metrics alone (404 elsewhere), for GET and HEAD alone (405 otherwise),
    HEAD answered with the headers of a GET, Content-Length included (health checks use it)."""
    def wrapped(environ, start_response):
        method = environ.get("REQUEST_METHOD")
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"fairsched serves its metrics at /metrics\n"]
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Content-Type", "text/plain; charset=utf-8"),
                                                      ("Allow", "GET, HEAD")])
            return [f"use GET or HEAD, not {method}\n".encode()]
        if method == "GET":
            return app(environ, start_response)
        answer = []
        body = app(dict(environ, REQUEST_METHOD="GET"),
                   lambda status, headers, exc_info=None: answer.append((status, headers, exc_info)))
        try:
            length = sum(len(chunk) for chunk in body)
        finally:
            if hasattr(body, "close"):
                body.close()
        status, headers, exc_info = answer[-1]
        headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        start_response(status, headers + [("Content-Length", str(length))], exc_info)
        return []
    return wrapped


def _answering_anyway(app):
    """The app, answering in the plain text format an Accept header it cannot read (it fails
    on `application/openmetrics-text; version=abc`), and answering a failure of its own with
    a 500 and one log line: wsgiref would print a traceback among the log lines."""
    def wrapped(environ, start_response):
        try:
            return app(environ, start_response)
        except Exception:
            if "HTTP_ACCEPT" in environ:
                try:
                    return app({k: v for k, v in environ.items() if k != "HTTP_ACCEPT"},
                               start_response)
                except Exception:
                    pass
            exc = sys.exception()
            log.error("metrics: cannot answer a scrape: %s: %s", type(exc).__name__, exc)
            start_response("500 Internal Server Error", [("Content-Type", "text/plain")],
                           sys.exc_info())
            return [b"fairsched could not gather its metrics: see its log\n"]
    return wrapped


class PrometheusObserver(Observer):
    """Serves /metrics on `address` ("host:port" or "[ipv6]:port"; an empty host listens on
    every IPv4 interface)."""

    def __init__(self, address: str):
        host, self.port, self.ipv6 = metrics_address(address)
        self.host = host or "0.0.0.0"
        self.registry = CollectorRegistry(auto_describe=False)
        self.snapshot = Snapshot()
        self.depth = QueueDepth(self._database_url)
        self.server: ThreadingWSGIServer | None = None
        self.thread: threading.Thread | None = None
        self._sup = None
        self._timer = None
        self._refresh_failed = False
        r = self.registry
        self.finished = Counter("fairsched_jobs_finished", "Job attempts finished, by type and "
                                "outcome (succeeded, failed for good, retried, cancelled, "
                                "returned to the queue).", ["type", "outcome"], registry=r)
        self.unrecorded = Counter("fairsched_jobs_unrecorded", "Attempts counted in "
                                  "fairsched_jobs_finished_total whose outcome the job table "
                                  "refused: the job was no longer this supervisor's.",
                                  ["type", "outcome"], registry=r)
        self.waited = Histogram("fairsched_job_wait_seconds", "Time from a job becoming eligible "
                                "to its start.", ["type"], buckets=BUCKETS, registry=r)
        self.ran = Histogram("fairsched_job_run_seconds", "Time each attempt ran, whatever its "
                             "outcome.", ["type"], buckets=BUCKETS, registry=r)
        self.restarts = Counter("fairsched_worker_restarts", "Worker processes started again "
                                "after an exit or an operator's restart.", ["group"], registry=r)
        self.scaled = Counter("fairsched_worker_scale_changes", "Processes an autoscaled group "
                              "started (direction up) or stopped (down) as its load changed.",
                              ["group", "direction"], registry=r)
        self.recycles = Counter("fairsched_worker_recycles", "Worker processes replaced for "
                                "their group's max_jobs or max_rss, or killed above its "
                                "rss_limit.", ["group", "reason"], registry=r)
        self.losses = Counter("fairsched_claim_losses", "Claims lost to another supervisor.",
                              registry=r)
        self.pruned = Counter("fairsched_jobs_pruned", "Finished jobs this supervisor deleted "
                              "from the job table (prune_after).", registry=r)
        r.register(_StateCollector(self))

    # -- the Observer hooks, on the actor's loop -----------------------------------------------

    def start(self, sup) -> None:
        self._sup = sup
        for t in sup.planner.type_ids:  # every series exists from the start, so rate() sees the first job
            self.waited.labels(t)
            self.ran.labels(t)
            for outcome in OUTCOMES:
                self.finished.labels(t, outcome)
            for outcome in UNRECORDED_OUTCOMES:
                self.unrecorded.labels(t, outcome)
        for spec in sup.config.workers:
            self.restarts.labels(spec.name)
        self._refresh()
        try:
            app = _answering_anyway(_serving_metrics_only(make_wsgi_app(self.registry)))
            server = make_server(self.host, self.port, app,
                                 _ThreadingServer6 if self.ipv6 else _ThreadingServer,
                                 handler_class=_QuietHandler)
        except OSError as exc:
            log.error("metrics: cannot listen on %s (%s); running without metrics",
                      self._url_host(self.host, self.port), exc.strerror or exc)
            self._stop_refresh()
            return
        self.server = server
        self.thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5},
                                       name="fairsched-metrics", daemon=True)
        self.thread.start()
        host, port = server.server_address[:2]
        log.info("metrics on http://%s/metrics", self._url_host(host, port))

    def _url_host(self, host: str, port: int) -> str:
        return f"[{host}]:{port}" if self.ipv6 else f"{host}:{port}"

    def stop(self) -> None:
        self._stop_refresh()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        self.depth.close()

    def job_started(self, job_type: str, waited: float) -> None:
        self.waited.labels(job_type).observe(waited)

    def job_finished(self, job_type: str, outcome: str, seconds: float) -> None:
        self.finished.labels(job_type, outcome).inc()
        self.ran.labels(job_type).observe(seconds)

    def job_unrecorded(self, job_type: str, outcome: str) -> None:
        self.unrecorded.labels(job_type, outcome).inc()

    def worker_recycled(self, group: str, reason: str) -> None:
        self.recycles.labels(group, reason).inc()

    def worker_restarted(self, group: str) -> None:
        self.restarts.labels(group).inc()

    def group_scaled(self, group: str, processes: int, direction: str) -> None:
        self.scaled.labels(group, direction).inc()

    def claims_lost(self, count: int) -> None:
        self.losses.inc(count)

    def jobs_pruned(self, count: int) -> None:
        self.pruned.inc(count)

    # -- the snapshot ---------------------------------------------------------------------------

    def _refresh(self) -> None:
        sup = self._sup
        self._timer = sup.loop.call_later(SNAPSHOT_INTERVAL, self._refresh)
        try:
            self.snapshot = take_snapshot(sup)
            self._refresh_failed = False
        except Exception:  # the gauges go stale; the actor must not
            if not self._refresh_failed:
                log.exception("metrics: cannot copy the supervisor's state")
            self._refresh_failed = True

    def _stop_refresh(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _database_url(self) -> str | None:
        sup = self._sup
        database = sup.queue.database if sup is not None else None
        return database.url if database is not None else None
