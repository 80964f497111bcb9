"""Queue throughput of fairsched beside procrastinate, pgqueuer and a raw SQL floor, in one run.

    .venv/bin/python scripts/bench_throughput.py [--jobs 20000] [--only NAME ...]
                                                 [--processes 2] [--slots 512] [--rounds 1]
                                                 [--payload-bytes 0]

Every contender gets a fresh database (bench_<name>) on the same PostgreSQL server. N no-op jobs
are enqueued in batches of 1,000; the tables are VACUUM ANALYZEd and checkpointed; then the
consumers start and the script polls every 20 ms until every job has succeeded. `seconds` runs
from just before the consumers start to the last job's completion, both read from the server's
clock; `first s` is the same up to the first completion (start-up included), and `drain/s`
the rate from the first completion to the last, start-up left out; `wall` is when the poll
saw the last one. `busy %` is how much of the machine's CPUs was busy over `wall`
(every process: consumers, PostgreSQL, this script's polling), and `cpu us/job` that busy time
per job, from /proc/stat: a contender far below 100% waits on round trips, not on the CPUs.
Uses FAIRSCHED_DATABASE_URL when set, else an embedded PostgreSQL in
a temporary directory. A contender whose package is missing is skipped with a note:
pip install procrastinate pgqueuer asyncpg 'typer<=0.28'. On a busy machine, --rounds 3 keeps the best
of three interleaved runs of each contender.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONTENDERS = ("fairsched", "procrastinate", "pgqueuer", "pgqueuer-default", "floor")
PEERS = ("procrastinate", "pgqueuer", "pgqueuer-default")
ENQUEUE_BATCH = 1000
POLL_INTERVAL = 0.02
STALL_TIMEOUT = 30.0  # seconds without a single completion: the contender is stuck
STOP_TIMEOUT = 30.0

# Peer settings: the best of a few shapes tried on a 2-core machine with 2 processes. A no-op
# task gains nothing from concurrency; procrastinate fetches one job per query, and more
# coroutines per worker only contend for that query (16 ran at about 60% of the rate of 2).
# pgqueuer runs on asyncpg, its first driver: its psycopg driver waits for notifications on the
# one connection it has, holding it for up to a second (notifies(timeout=1.0)), and most runs
# stalled that long at the start (9,400-9,700 jobs/s against 19,100-19,400 with asyncpg, both
# batch 100). With asyncpg it ran best with batches of 500 to 1,000 (100: about 19,400; 200:
# 21,400; 500: 24,000; 1,000: 23,100; 2,000: 22,300). fairsched ran
# best with 512 to 1,000 slots per process (128 drained about 10% slower, 32 far slower): a
# no-op job is done long before the claim of the next one comes back, so it takes many jobs in
# flight to keep busy, and a larger claim costs less per job. pgqueuer-default is pgqueuer as
# shipped (batch 10, its QueueManager.run default) beside it; "vs best peer" takes the best.
PROCRASTINATE_CONCURRENCY = 2
PGQUEUER_BATCH = 500
PGQUEUER_DEFAULT_BATCH = 10  # QueueManager.run's default: pgqueuer as most users run it
FAIRSCHED_SLOTS = 512
FLOOR_BATCH = 32

HANDLER = '''
def noop(job):
    return None
'''

FLOOR_CLAIM = """
UPDATE fairsched_jobs
   SET status = 'running', attempts = attempts + 1, started_at = now(), claimed_by = %(me)s
 WHERE id IN (SELECT id FROM fairsched_jobs
               WHERE status = 'pending' AND type = 'noop'
               ORDER BY priority, run_after, id
               FOR UPDATE SKIP LOCKED LIMIT %(limit)s)
RETURNING id, payload
"""
FLOOR_COMPLETE = """
UPDATE fairsched_jobs SET status = 'succeeded', finished_at = now()
 WHERE id = ANY(%(ids)s) AND status = 'running' AND claimed_by = %(me)s
"""


class BenchError(Exception):
    """A contender could not be measured; the message is one line."""


class ServerError(Exception):
    """No PostgreSQL server to measure on."""


@dataclass
class Result:
    name: str
    setup: str
    jobs: int
    seconds: float
    first: float
    wall: float
    busy: float | None = None  # busy fraction of all CPUs over `wall`
    cpu_seconds: float | None = None  # busy CPU time over `wall`, all CPUs summed
    own_seconds: float | None = None  # CPU time of the consumers and the server's processes

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds


@dataclass
class Options:
    jobs: int
    processes: int
    slots: int
    folder: Path
    payload_bytes: int = 0

    @property
    def payload(self) -> dict | None:
        """Every job's payload: {"data": "xxx..."} of about payload_bytes, or none."""
        return {"data": "x" * self.payload_bytes} if self.payload_bytes else None


# -- the contenders: how to fill their queue and how to start their consumers -------------------


class Contender:
    name = ""
    packages: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()
    done_sql = ""
    failed_sql = ""
    finished_sql = ""  # the first and the last completion time

    def setup(self, opts: Options) -> str:
        return ""

    def prepare(self, url: str, opts: Options) -> None:
        raise NotImplementedError

    def start(self, url: str, opts: Options) -> list[subprocess.Popen]:
        raise NotImplementedError


class Fairsched(Contender):
    name = "fairsched"
    worker_settings = ""  # more lines of the [[worker]] table (scripts/bench_recycle.py)
    handler_code = HANDLER  # bench_handlers.py, whose noop(job) the workers run
    log_args = ("--log-level", "warning")
    tables = ("fairsched_jobs",)
    done_sql = "SELECT count(*) FROM fairsched_jobs WHERE status = 'succeeded'"
    failed_sql = "SELECT count(*) FROM fairsched_jobs WHERE status = 'failed'"
    finished_sql = "SELECT min(finished_at), max(finished_at) FROM fairsched_jobs"

    def setup(self, opts):
        return f"{opts.processes} proc x {opts.slots} slots"

    def prepare(self, url, opts):
        from fairsched.store.queue import Queue
        from fairsched.store.schema import migrate

        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
            queue = Queue(conn)
            for size in batches(opts.jobs):
                queue.enqueue_many([{"type": "noop", "payload": opts.payload}] * size)

    def start(self, url, opts):
        folder = Path(tempfile.mkdtemp(prefix="fairsched-", dir=opts.folder))
        (folder / "bench_handlers.py").write_text(self.handler_code)
        config = folder / "workers.toml"
        config.write_text(textwrap.dedent(f"""\
            [supervisor]
            state_dir = "state"

            [[worker]]
            name = "noop"
            types = ["noop"]
            handler = "bench_handlers:noop"
            processes = {opts.processes}
            slots = {opts.slots}
            """) + self.worker_settings)
        pythonpath = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, FAIRSCHED_DATABASE_URL=url, PYTHONPATH=pythonpath)
        self.log = folder / "supervisor.log"
        return [spawn([sys.executable, "-m", "fairsched", "supervise", "--config", str(config),
                       *self.log_args], self.log, env, folder)]


class Procrastinate(Contender):
    name = "procrastinate"
    packages = ("procrastinate",)
    tables = ("procrastinate_jobs", "procrastinate_events")
    done_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
    failed_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'failed'"
    finished_sql = ("SELECT min(at), max(at) FROM procrastinate_events"
                    " WHERE type = 'succeeded'")

    def setup(self, opts):
        return f"{opts.processes} proc x {PROCRASTINATE_CONCURRENCY} concurrency"

    def prepare(self, url, opts):
        async def fill():
            app, noop = procrastinate_app(url, pool_size=2)
            async with app.open_async():
                await app.schema_manager.apply_schema_async()
                for size in batches(opts.jobs):
                    await noop.batch_defer_async(*([opts.payload or {}] * size))
        asyncio.run(fill())

    def start(self, url, opts):
        return spawn_consumers(self.name, url, opts, PROCRASTINATE_CONCURRENCY)


class Pgqueuer(Contender):
    name = "pgqueuer"
    packages = ("pgqueuer", "asyncpg")
    tables = ("pgqueuer", "pgqueuer_log")
    # A finished job leaves the queue table and gets a log row, in one statement.
    done_sql = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
    failed_sql = "SELECT count(*) FROM pgqueuer_log WHERE status IN ('exception', 'failed')"
    finished_sql = ("SELECT min(created), max(created) FROM pgqueuer_log"
                    " WHERE status = 'successful'")

    def setup(self, opts):
        return f"{opts.processes} proc x batch {PGQUEUER_BATCH}"

    def prepare(self, url, opts):
        async def fill():
            from pgqueuer import PsycopgDriver, Queries

            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                queries = Queries(PsycopgDriver(conn))
                await queries.install()
                for size in batches(opts.jobs):
                    payload = json.dumps(opts.payload).encode() if opts.payload else None
                    await queries.enqueue(["noop"] * size, [payload] * size, [0] * size)
        asyncio.run(fill())

    def start(self, url, opts):
        return spawn_consumers(self.name, url, opts, PGQUEUER_BATCH)


class PgqueuerDefault(Pgqueuer):
    name = "pgqueuer-default"

    def setup(self, opts):
        return f"{opts.processes} proc x batch {PGQUEUER_DEFAULT_BATCH} (default)"

    def start(self, url, opts):
        return spawn_consumers(self.name, url, opts, PGQUEUER_DEFAULT_BATCH)


class Floor(Contender):
    name = "floor"
    tables = ("fairsched_jobs",)
    done_sql = Fairsched.done_sql
    failed_sql = Fairsched.failed_sql
    finished_sql = Fairsched.finished_sql

    def setup(self, opts):
        return f"{opts.processes} proc x claim {FLOOR_BATCH}"

    def prepare(self, url, opts):
        # The same table as fairsched's, filled and drained with nothing but SQL.
        from fairsched.store.schema import migrate

        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
            for size in batches(opts.jobs):
                conn.execute("INSERT INTO fairsched_jobs (type, payload) SELECT 'noop', %s::jsonb"
                             " FROM generate_series(1, %s)",
                             (json.dumps(opts.payload) if opts.payload else None, size))

    def start(self, url, opts):
        return spawn_consumers(self.name, url, opts, FLOOR_BATCH)


# -- consumers of the peers and the floor, each run in its own process --------------------------


def procrastinate_app(url: str, pool_size: int):
    import procrastinate

    # Its warning about an app defined in __main__ concerns task names derived from the
    # module; the task here is named explicitly.
    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=url, min_size=1, max_size=pool_size))

    @app.task(name="noop")
    async def noop(data=None):
        return None

    return app, noop


def consume_procrastinate(url: str, concurrency: int) -> None:
    app, _ = procrastinate_app(url, pool_size=concurrency + 2)
    app.run_worker(concurrency=concurrency, wait=True, listen_notify=True)


def consume_pgqueuer(url: str, batch: int) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    async def run():
        conn = await asyncpg.connect(url)
        try:
            manager = QueueManager(Queries(AsyncpgDriver(conn)))

            @manager.entrypoint("noop")
            async def noop(job):
                return None

            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, manager.shutdown.set)
            await manager.run(batch_size=batch, mode=QueueExecutionMode.drain)
        finally:
            await conn.close()
    asyncio.run(run())


def consume_floor(url: str, batch: int) -> None:
    me = os.getpid()
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            ids = [r[0] for r in conn.execute(FLOOR_CLAIM, {"me": me, "limit": batch})]
            if not ids:
                return
            conn.execute(FLOOR_COMPLETE, {"ids": ids, "me": me})


CONSUMERS = {"procrastinate": consume_procrastinate, "pgqueuer": consume_pgqueuer,
             "pgqueuer-default": consume_pgqueuer, "floor": consume_floor}


def spawn_consumers(name: str, url: str, opts: Options, setting: int) -> list[subprocess.Popen]:
    # The URL goes by environment: a password in it stays out of `ps`.
    env = dict(os.environ, BENCH_THROUGHPUT_URL=url)
    return [spawn([sys.executable, __file__, "--consumer", name, str(setting)],
                  opts.folder / f"{name}-{i}.log", env, opts.folder)
            for i in range(1, opts.processes + 1)]


def spawn(cmd: list[str], log: Path, env: dict, cwd: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        # A session of its own: whatever it forks can be killed with it as one group.
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
    proc.log = log
    return proc


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.1, deadline - time.monotonic()))
        # Leftovers of the group (a worker whose supervisor died, or a hung consumer).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def last_line(proc: subprocess.Popen) -> str:
    try:
        lines = [line for line in proc.log.read_text(errors="replace").splitlines()
                 if line.strip()]
    except OSError:
        lines = []
    return lines[-1].strip() if lines else "(no output)"


# -- measuring ----------------------------------------------------------------------------------


def measure(contender: Contender, url: str, opts: Options) -> Result:
    contender.prepare(url, opts)
    with psycopg.connect(url, autocommit=True) as conn:
        for table in contender.tables:
            conn.execute(f"VACUUM ANALYZE {table}")
        # Start every contender with no dirty pages left by its own enqueue (needs superuser).
        with contextlib.suppress(psycopg.Error):
            conn.execute("CHECKPOINT")
        started = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        postmaster = server_pid(conn)
        t0 = time.monotonic()
        cpu0 = cpu_times()
        own0 = own_cpu((), postmaster)
        procs = contender.start(url, opts)
        try:
            wall = wait_done(conn, contender, procs, opts.jobs, t0)
            cpu1 = cpu_times()
            own1 = own_cpu([p.pid for p in procs], postmaster)
            first, seconds = conn.execute(
                f"SELECT extract(epoch FROM f.min - %(t)s)::float8,"
                f" extract(epoch FROM f.max - %(t)s)::float8"
                f" FROM ({contender.finished_sql}) AS f(min, max)", {"t": started}).fetchone()
        finally:
            stop(procs)
    if seconds is None or seconds <= 0:
        raise BenchError("no completion time recorded")
    busy = cpu_seconds = None
    if cpu0 is not None and cpu1 is not None and cpu1[1] > cpu0[1]:
        cpu_seconds = cpu1[0] - cpu0[0]
        busy = cpu_seconds / (cpu1[1] - cpu0[1])
    own = own1 - own0 if own0 is not None and own1 is not None else None
    return Result(contender.name, contender.setup(opts), opts.jobs, seconds, first, wall,
                  busy, cpu_seconds, own)


def server_pid(conn) -> int | None:
    """The postmaster's pid when the server runs on this host (the checkpointer's parent)."""
    with contextlib.suppress(psycopg.Error, OSError, ValueError, TypeError):
        pid = conn.execute("SELECT pid FROM pg_stat_activity"
                           " WHERE backend_type = 'checkpointer'").fetchone()[0]
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        if stat[stat.find("(") + 1:stat.rfind(")")] == "postgres":
            return int(stat[stat.rfind(")") + 2:].split()[1])
    return None


def own_cpu(roots, postmaster: int | None) -> float | None:
    """CPU seconds used so far by the consumers (the processes `roots`, every process below
    them, and the exited ones they reaped: a worker forked in a session of its own, or gone
    since, counts) and the server's processes: unlike /proc/stat, blind to whatever else the
    machine runs. None off Linux or with a server on another host."""
    if postmaster is None:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    times: dict[int, int] = {}  # pid: its CPU ticks and its reaped children's
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        pid, parent[int(name)] = int(name), int(fields[1])
        own = int(fields[11]) + int(fields[12])
        times[pid] = own if pid == postmaster or parent[pid] == postmaster else (
            own + int(fields[13]) + int(fields[14]))

    def counted(pid: int) -> bool:
        if pid == postmaster or parent.get(pid) == postmaster:
            return True
        seen = 0
        while pid > 1 and seen < 64:  # up the tree to one of the roots
            if pid in roots:
                return True
            pid, seen = parent.get(pid, 0), seen + 1
        return False

    roots = set(roots)
    return sum(t for pid, t in times.items() if counted(pid)) / tick


def cpu_times() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine so far, summed over CPUs; Linux only."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    tick = os.sysconf("SC_CLK_TCK")
    return (total - idle) / tick, total / tick


def interleaved(setups: list[Contender], server: str, database: str, opts: Options,
                rounds: int, after=None) -> dict[str, list[Result]]:
    """Measure each of `setups` in `rounds` interleaved rounds (any drift of the machine hits
    them all), each run on a fresh `database`; `after(setup)` is called after each run."""
    results: dict[str, list[Result]] = {setup.name: [] for setup in setups}
    for _ in range(rounds):
        for setup in setups:
            with fresh_database(server, database) as url:
                results[setup.name].append(measure(setup, url, opts))
            if after is not None:
                after(setup)
    return results


def print_best_rounds(results: dict[str, list[Result]], labels: dict[str, str]) -> dict:
    """A line per setup (`labels` by name): its best jobs/s, then each round's; the best
    Result by name."""
    best = {name: max(runs, key=lambda r: r.rate) for name, runs in results.items()}
    print(f"{'setup':28s} {'jobs/s (best)':>14s}   jobs/s of each round")
    for name, runs in results.items():
        print(f"{labels[name]:28s} {best[name].rate:14.0f}   "
              + " ".join(f"{r.rate:.0f}" for r in runs))
    return best


def wait_done(conn, contender: Contender, procs, jobs: int, t0: float) -> float:
    """Poll until every job succeeded; the wall time it took, or BenchError."""
    seen, progressed = -1, t0
    while True:
        done = conn.execute(contender.done_sql).fetchone()[0]
        now = time.monotonic()
        if done >= jobs:
            return now - t0
        if done > seen:
            seen, progressed = done, now
        elif now - progressed > STALL_TIMEOUT:
            raise BenchError(f"stalled at {done} of {jobs} jobs for {STALL_TIMEOUT:.0f} s")
        crashed = [p for p in procs if p.poll() not in (None, 0)]
        if crashed:
            raise BenchError(f"exit code {crashed[0].returncode}: {last_line(crashed[0])}")
        # A stall of a second or more: see whether jobs are being dead-lettered.
        if contender.failed_sql and now - progressed > 1.0:
            failed = conn.execute(contender.failed_sql).fetchone()[0]
            if failed:
                raise BenchError(f"jobs failed: {failed}; last log line: {last_line(procs[0])}")
        if all(p.poll() is not None for p in procs):
            # The last commit may have landed after this round's count.
            if conn.execute(contender.done_sql).fetchone()[0] >= jobs:
                return time.monotonic() - t0
            raise BenchError(f"consumers exited with {done} of {jobs} jobs done")
        time.sleep(POLL_INTERVAL)


def batches(total: int):
    for start in range(0, total, ENQUEUE_BATCH):
        yield min(ENQUEUE_BATCH, total - start)


def database_url(server: str, name: str) -> str:
    """The server's URL (or conninfo string) pointed at database `name`."""
    parts = urlsplit(server)
    if parts.scheme in ("postgres", "postgresql"):
        query = [(k, v) for k, v in parse_qsl(parts.query) if k != "dbname"]
        return urlunsplit(parts._replace(path="/" + name, query=urlencode(query)))
    return make_conninfo(server, dbname=name)


@contextlib.contextmanager
def fresh_database(server: str, name: str):
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield database_url(server, name)
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextlib.contextmanager
def postgres_server(folder: Path):
    """FAIRSCHED_DATABASE_URL, else an embedded server stopped on the way out."""
    url = os.environ.get("FAIRSCHED_DATABASE_URL")
    if url:
        yield url, "FAIRSCHED_DATABASE_URL"
        return
    from fairsched.store.embedded import Cluster

    try:
        server = Cluster(folder / "pg")
        server.prepare()
        server.start()
    except Exception as exc:
        raise ServerError(f"cannot start an embedded PostgreSQL in {folder}: {one_line(exc)}"
                          " (or set FAIRSCHED_DATABASE_URL)") from exc
    try:
        yield server.url(), "embedded"
    finally:
        server.stop()


def print_table(runs: dict[str, list[Result]]) -> None:
    best = {name: min(results, key=lambda r: r.seconds) for name, results in runs.items()}
    peers = [r.rate for name, r in best.items() if name in PEERS]
    best_peer = max(peers) if peers else None
    floor = best["floor"].rate if "floor" in best else None
    rounds = max(len(results) for results in runs.values())
    print(f"{'contender':16s} {'setup':30s} {'jobs':>7s} {'seconds':>8s} {'jobs/s':>8s}"
          f" {'vs best peer':>12s} {'vs floor':>9s} {'first s':>8s} {'drain/s':>8s} {'wall s':>7s}"
          f" {'busy %':>7s} {'cpu us/job':>11s} {'own us/job':>11s}"
          + ("   jobs/s of each round" if rounds > 1 else ""))
    for name, r in best.items():
        vs_peer = f"{r.rate / best_peer:.2f}x" if best_peer else "-"
        vs_floor = f"{r.rate / floor:.2f}x" if floor else "-"
        each = "   " + " ".join(f"{x.rate:.0f}" for x in runs[name]) if rounds > 1 else ""
        busy = f"{r.busy * 100:.0f}" if r.busy is not None else "-"
        per_job = f"{r.cpu_seconds / r.jobs * 1e6:.0f}" if r.cpu_seconds is not None else "-"
        own = f"{r.own_seconds / r.jobs * 1e6:.0f}" if r.own_seconds is not None else "-"
        drained = r.seconds - r.first
        drain = f"{(r.jobs - 1) / drained:.0f}" if drained > 0 else "-"
        print(f"{r.name:16s} {r.setup:30s} {r.jobs:7d} {r.seconds:8.2f} {r.rate:8.0f}"
              f" {vs_peer:>12s} {vs_floor:>9s} {r.first:8.2f} {drain:>8s} {r.wall:7.2f}"
              f" {busy:>7s} {per_job:>11s} {own:>11s}{each}")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def one_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=positive_int, default=20000,
                        help="no-op jobs per contender (default 20000)")
    parser.add_argument("--payload-bytes", type=int, default=0, metavar="N",
                        help="give every job a JSON payload of about N bytes (default 0: none)")
    parser.add_argument("--only", action="append", choices=CONTENDERS, metavar="NAME",
                        help=f"run only this contender; repeatable ({', '.join(CONTENDERS)})")
    parser.add_argument("--processes", type=positive_int, default=2,
                        help="consumer processes of every contender (default 2)")
    parser.add_argument("--slots", type=positive_int, default=FAIRSCHED_SLOTS,
                        help=f"fairsched slots per worker process (default {FAIRSCHED_SLOTS})")
    parser.add_argument("--rounds", type=positive_int, default=1,
                        help="measure every contender this many times, interleaved, and keep"
                             " each one's best (default 1; more on a busy machine)")
    args = parser.parse_args()
    if args.payload_bytes < 0:
        parser.error(f"--payload-bytes must be >= 0, got {args.payload_bytes}")
    # Stopped from outside, still stop the consumers and the server on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))

    contenders = [c for c in (Fairsched(), Procrastinate(), Pgqueuer(), PgqueuerDefault(), Floor())
                  if not args.only or c.name in args.only]
    t_start = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix="fsbt-", dir="/tmp"))
    runs: dict[str, list[Result]] = {}
    try:
        with postgres_server(folder) as (server, kind):
            with psycopg.connect(server, autocommit=True) as conn:
                version = conn.execute("SHOW server_version").fetchone()[0]
            payload = f", payloads of {args.payload_bytes} bytes" if args.payload_bytes else ""
            print(f"PostgreSQL {version} ({kind}); {args.jobs} no-op jobs{payload} per contender,"
                  f" enqueued in batches of {ENQUEUE_BATCH}")
            for contender in list(contenders):
                missing = [p for p in contender.packages if importlib.util.find_spec(p) is None]
                if missing:
                    print(f"{contender.name}: skipped, not installed: {', '.join(missing)}"
                          f" (pip install {' '.join(missing)})")
                    contenders.remove(contender)
            opts = Options(args.jobs, args.processes, args.slots, folder, args.payload_bytes)
            for _ in range(args.rounds):
                for contender in list(contenders):
                    try:
                        database = "bench_" + contender.name.replace("-", "_")
                        with fresh_database(server, database) as url:
                            result = measure(contender, url, opts)
                    except Exception as exc:  # one contender's failure must not stop the others
                        detail = one_line(exc)
                        if not isinstance(exc, BenchError):
                            detail = f"{type(exc).__name__}: {detail}"
                        print(f"{contender.name}: not measured: {detail}")
                        contenders.remove(contender)
                        continue
                    runs.setdefault(contender.name, []).append(result)
    except ServerError as exc:
        print(f"bench_throughput: {exc}", file=sys.stderr)
        return 1
    except (psycopg.Error, OSError) as exc:
        print(f"bench_throughput: cannot use the PostgreSQL server: {one_line(exc)}",
              file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print()
    if runs:
        print_table(runs)
    else:
        print("nothing measured")
    best_of = f"best of {args.rounds} rounds; " if args.rounds > 1 else ""
    print(f"\n({best_of}seconds = consumer start to last completion on the server's clock;"
          f" total {time.monotonic() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--consumer"]:
        _, _, kind, setting = sys.argv
        CONSUMERS[kind](os.environ["BENCH_THROUGHPUT_URL"], int(setting))
    else:
        sys.exit(main())
