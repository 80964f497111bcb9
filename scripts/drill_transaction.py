"""The delivery drill of docs/operations.md at length: jobs whose handler inserts one row per
run, on two supervisors, while a worker is killed (SIGKILL) at a steady pace and one supervisor
is killed and started again several times; then the same with the row written outside
job.transaction(). Prints, for each handler, how the jobs ended and how many rows each wrote.

    .venv/bin/python scripts/drill_transaction.py [--jobs 5000] [--every 0.2]
                                                  [--supervisor-kills 4] [--seconds 0.02]

The transactional handler must end every job `succeeded` with exactly one row (exit 1
otherwise); the plain one shows the rows a run killed after its insert leaves behind. Uses
FAIRSCHED_DATABASE_URL when set (a fresh database on that server), else an embedded
PostgreSQL in a temporary directory.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import signal
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import psutil
import psycopg
from bench_throughput import fresh_database, positive_int, postgres_server, spawn, stop

HANDLERS = '''
import os
import threading
import time

import psycopg

_own = threading.local()


def _note_pid(path):
    if getattr(_note_pid, "pid", None) != os.getpid():
        _note_pid.pid = os.getpid()
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\\n")


def tx_row(job):
    _note_pid(job.payload["pids"])
    with job.transaction() as conn:
        conn.execute("INSERT INTO drill_rows (job_id) VALUES (%s)", (job.id,))
        time.sleep(job.payload["seconds"])


def plain_row(job):
    _note_pid(job.payload["pids"])
    if getattr(_own, "conn", None) is None or _own.conn.closed:
        _own.conn = psycopg.connect(os.environ["FAIRSCHED_QUEUE_DATABASE"], autocommit=True)
    _own.conn.execute("INSERT INTO drill_rows (job_id) VALUES (%s)", (job.id,))
    time.sleep(job.payload["seconds"])
'''

WORKERS = """
[supervisor]
state_dir = "state-{n}"
lease = 2

[[worker]]
name = "rows"
types = ["rows"]
handler = "drill_handlers:{handler}"
processes = 2
slots = 2
max_attempts = 100000
max_restarts = 100000
restart_window = 0.5
retry_backoff = 0
"""


def finished(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM fairsched_jobs WHERE status IN"
                            " ('succeeded', 'failed', 'cancelled')").fetchone()[0]


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"error: timed out waiting for {what}")
        time.sleep(0.1)


def drill(url: str, folder: Path, handler: str, args) -> tuple[dict, collections.Counter, int]:
    from fairsched.store.queue import Queue
    from fairsched.store.schema import migrate

    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        conn.execute("CREATE TABLE drill_rows (job_id bigint NOT NULL)")
    work = folder / handler
    work.mkdir()
    (work / "drill_handlers.py").write_text(HANDLERS)
    pids = work / "pids"
    pids.touch()
    env = dict(os.environ, FAIRSCHED_DATABASE_URL=url,
               PYTHONPATH=os.pathsep.join(filter(None, [str(work), os.environ.get("PYTHONPATH")])))
    configs = []
    for n in range(2):
        configs.append(work / f"workers-{n}.toml")
        configs[n].write_text(textwrap.dedent(WORKERS.format(n=n, handler=handler)))
    starts = collections.Counter()

    def start(n: int):
        starts[n] += 1
        return spawn([sys.executable, "-m", "fairsched", "supervise", "--config", str(configs[n]),
                      "--log-level", "warning"], work / f"supervisor-{n}.{starts[n]}.log", env,
                     work)

    sups = [start(0), start(1)]
    with psycopg.connect(url, autocommit=True) as conn:
        queue = Queue(conn)
        payload = {"pids": str(pids), "seconds": args.seconds}
        for first in range(0, args.jobs, 1000):
            queue.enqueue_many([{"type": "rows", "payload": payload}]
                               * min(1000, args.jobs - first))
    stop_killing = threading.Event()
    kills = 0
    rng = random.Random(7)

    def killer():
        nonlocal kills
        while not stop_killing.wait(args.every):
            parents = {s.pid for s in sups if s.poll() is None}
            alive = []
            for line in pids.read_text().split():
                try:
                    if psutil.Process(int(line)).ppid() in parents:
                        alive.append(int(line))
                except psutil.NoSuchProcess:
                    pass
            if alive:
                os.kill(rng.choice(alive), signal.SIGKILL)
                kills += 1

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        for k in range(1, args.supervisor_kills + 1):
            wait_for(lambda k=k: finished(url) >= args.jobs * k // (args.supervisor_kills + 1),
                     600, f"{k}/{args.supervisor_kills + 1} of the jobs")
            sups[0].kill()
            sups[0].wait()
            sups[0] = start(0)
        wait_for(lambda: finished(url) >= args.jobs, 600, "every job")
    finally:
        stop_killing.set()
        thread.join()
        stop(sups)
    with psycopg.connect(url) as conn:
        statuses = dict(conn.execute("SELECT status, count(*) FROM fairsched_jobs"
                                     " GROUP BY status").fetchall())
        per_job = collections.Counter(dict(conn.execute(
            "SELECT j.id, count(r.job_id) FROM fairsched_jobs j LEFT JOIN drill_rows r"
            " ON r.job_id = j.id GROUP BY j.id").fetchall()))
    return statuses, collections.Counter(per_job.values()), kills


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=positive_int, default=5000, help="jobs (default 5000)")
    parser.add_argument("--every", type=float, default=0.2,
                        help="seconds between worker kills (default 0.2)")
    parser.add_argument("--supervisor-kills", type=positive_int, default=4,
                        help="times one supervisor is killed and started again (default 4)")
    parser.add_argument("--seconds", type=float, default=0.02,
                        help="seconds each run waits after its insert (default 0.02)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="fsdt-", dir="/tmp"))
    good = True
    try:
        with postgres_server(folder) as (server, kind):
            print(f"{args.jobs} jobs, 2 supervisors x 2 processes x 2 slots, a worker killed "
                  f"every {args.every:g} s, a supervisor killed {args.supervisor_kills} times; "
                  f"PostgreSQL ({kind})")
            for handler in ("tx_row", "plain_row"):
                with fresh_database(server, "drill_transaction") as url:
                    started = time.monotonic()
                    statuses, rows, kills = drill(url, folder, handler, args)
                took = time.monotonic() - started
                label = ("job.transaction()" if handler == "tx_row"
                         else "own connection")
                print(f"{label:18s} {took:6.1f} s, {kills} workers killed; jobs "
                      f"{dict(sorted(statuses.items()))}; jobs by rows written "
                      f"{dict(sorted(rows.items()))}")
                if handler == "tx_row":
                    good = statuses == {"succeeded": args.jobs} and set(rows) == {1}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print("every transactional row written exactly once" if good else
          "error: the transactional rows were not each written once")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
