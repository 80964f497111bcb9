"""Fault drill: several supervisors on one PostgreSQL under random faults, then the invariants.

    .venv/bin/python scripts/chaos.py [--supervisors 3] [--jobs 3000] [--seconds 120]
                                      [--seed N] [--folder DIR] [--keep]

Starts an embedded PostgreSQL in a temporary folder and N supervisors on it, each with three
worker groups (types a, b, and a versatile group for a, b and c). Jobs are enqueued in waves
(some fail now and then, all sleep a little) while, every 0.5 to 3 s, one fault strikes: a
worker killed with SIGKILL, a supervisor killed with SIGKILL (started again a few seconds
later), a supervisor frozen with SIGSTOP past its lease and then let go, PostgreSQL restarted,
`fairsched restart` of a group, `fairsched stop` and a fresh start, `fairsched cancel` of a
job; meanwhile a user keeps asking random supervisors for on-demand jobs. After --seconds the
faults stop, and once every job has ended it checks:

- every job ended `succeeded`, or `cancelled` when it was cancelled;
- no two runs of one job ever overlapped: each run holds an exclusive lock on a file of its
  job's own, and a run that finds it taken records an overlap;
- every succeeded job's side effect was recorded, and more than once only when the supervisor
  of its first run was killed or frozen on purpose (its outcome was lost with it);
- every on-demand request ended in its result (exit 0) or one line saying why not (exit 1:
  its supervisor was stopped or killed meanwhile, say), within its --timeout;
- no supervisor's log holds a traceback, and each supervisor not killed on purpose exited 0
  (or 1, saying it could not start while PostgreSQL restarted: a service manager starts it
  again, as the drill does).

It prints the faults made and the counts, and exits 1 when an invariant broke (the folder
is then kept for a look, as with --keep).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fairsched.store.embedded import Cluster  # noqa: E402
from fairsched.store.queue import Queue  # noqa: E402
from fairsched.store.schema import migrate  # noqa: E402

LEASE = 4.0
FINAL = ("succeeded", "failed", "cancelled")

HANDLER = '''
import fcntl
import os
import random
import time


def _note(folder, line):
    fd = os.open(os.path.join(folder, "runs.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (line + "\\n").encode())
    finally:
        os.close(fd)


def work(job):
    p = job.payload
    # On-demand ids are each supervisor's own (od-1, od-2 ...): those requests name their lock.
    lock = p.get("lock", str(job.id))
    fd = os.open(os.path.join(p["dir"], "locks", lock), os.O_CREAT | os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _note(p["dir"], f"overlap {job.id} {job.attempt} {os.getpid()}")
            raise
        deadline = time.monotonic() + p["seconds"]
        while time.monotonic() < deadline:
            if job.cancelled():
                return {"cancelled": True}
            time.sleep(0.01)
        if random.random() < p["fail"]:
            raise RuntimeError("failing now and then, on purpose")
        _note(p["dir"], f"done {job.id} {job.attempt} {os.getpid()}")
        return {"id": job.id}
    finally:
        os.close(fd)
'''

WORKERS = f"""\
[supervisor]
state_dir = "state"
lease = {LEASE}
shutdown_timeout = 5

[[worker]]
name = "a"
types = ["a"]
handler = "chaos_handlers:work"
processes = 2
slots = 2
max_attempts = 100
retry_backoff = 0.1

[[worker]]
name = "b"
types = ["b"]
handler = "chaos_handlers:work"
processes = 1
slots = 3
max_attempts = 100
retry_backoff = 0.1

[[worker]]
name = "abc"
types = ["a", "b", "c"]
handler = "chaos_handlers:work"
processes = 1
slots = 2
max_attempts = 100
retry_backoff = 0.1
"""


class Supervisor:
    def __init__(self, folder: Path, env: dict):
        self.folder = folder
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.killed_on_purpose: set[int] = set()  # pids
        self.disrupted: set[Path] = set()  # logs of the runs killed or frozen on purpose
        self.bad_exits: list[str] = []

    def start(self) -> None:
        self.starts += 1
        self.log = self.folder / f"supervisor-{self.starts}.log"
        log = open(self.log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fairsched", "supervise", "--config",
             str(self.folder / "workers.toml")], cwd=self.folder, env=self.env,
            stdout=log, stderr=subprocess.STDOUT)

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "fairsched", *args, "--config",
                               str(self.folder / "workers.toml")], cwd=self.folder,
                              env=self.env, capture_output=True, text=True, timeout=timeout)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def reap(self) -> bool:
        """Note how a supervisor that ended on its own exited; True if it could not start for
        want of PostgreSQL (restarting, say): exit 1 saying so, before it started, for a
        service manager to start it again."""
        refused = False
        if self.proc is not None and self.proc.poll() is not None:
            if self.proc.pid not in self.killed_on_purpose and self.proc.returncode != 0:
                text = self.log.read_text(errors="replace")
                refused = (self.proc.returncode == 1 and " started (pid " not in text
                           and ("cannot connect to PostgreSQL" in text
                                or "cannot use the database" in text))
                if not refused:
                    self.bad_exits.append(f"pid {self.proc.pid} exited {self.proc.returncode}")
            self.proc = None
        return refused

    def worker_pids(self) -> list[int]:
        result = self.cli("ps", "--json", timeout=20)
        if result.returncode != 0:
            return []
        rows = json.loads(result.stdout)
        rows = rows.get("slots", rows) if isinstance(rows, dict) else rows
        return sorted({r["pid"] for r in rows if r.get("pid")})


class Drill:
    def __init__(self, args, folder: Path, pg, url: str):
        self.args = args
        self.folder = folder
        self.pg = pg
        self.url = url
        self.rng = random.Random(args.seed)
        self.faults = collections.Counter()
        self.cancelled: set[int] = set()
        self.on_demand = collections.Counter()
        self.on_demand_problems: list[str] = []
        env = dict(os.environ, FAIRSCHED_DATABASE_URL=url, PYTHONPATH=str(folder))
        self.sups = []
        for i in range(args.supervisors):
            sup_folder = folder / f"s{i}"
            sup_folder.mkdir()
            (sup_folder / "workers.toml").write_text(WORKERS)
            self.sups.append(Supervisor(sup_folder, env))

    def enqueue(self, n: int) -> list[int]:
        jobs = [{"type": self.rng.choices("abc", weights=(6, 3, 1))[0],
                 "priority": self.rng.randint(0, 10), "max_attempts": 100,
                 "payload": {"dir": str(self.folder), "seconds": self.rng.uniform(0.01, 0.3),
                             "fail": 0.1}} for _ in range(n)]
        for _ in range(100):  # PostgreSQL may be restarting
            try:
                with psycopg.connect(self.url, autocommit=True) as conn:
                    return Queue(conn).enqueue_many(jobs)
            except psycopg.OperationalError:
                time.sleep(0.2)
        raise RuntimeError("could not enqueue for 20 s")

    def strike(self, ids: list[int]) -> None:
        sup = self.rng.choice(self.sups)
        fault = self.rng.choice(["kill worker", "kill worker", "kill supervisor",
                                 "freeze supervisor", "restart postgres", "restart group",
                                 "stop and start", "cancel"])
        if fault != "restart postgres" and fault != "cancel" and not sup.alive():
            if sup.reap():
                self.faults["refused to start: no database"] += 1
            sup.start()
            self.faults["started again"] += 1
            return
        if fault == "kill worker":
            pids = sup.worker_pids()
            if not pids:
                return
            os.kill(self.rng.choice(pids), signal.SIGKILL)
        elif fault == "kill supervisor":
            sup.killed_on_purpose.add(sup.proc.pid)
            sup.disrupted.add(sup.log)
            sup.proc.kill()
            sup.proc.wait()
        elif fault == "freeze supervisor":
            sup.disrupted.add(sup.log)
            sup.proc.send_signal(signal.SIGSTOP)
            time.sleep(LEASE * self.rng.uniform(0.5, 2.0))
            sup.proc.send_signal(signal.SIGCONT)
        elif fault == "restart postgres":
            self.pg.restart(self.rng.choice(["fast", "immediate"]))
        elif fault == "restart group":
            sup.cli("restart", self.rng.choice(["a", "b", "abc", "a-1"]))
        elif fault == "stop and start":
            result = sup.cli("stop", "--timeout", "30")
            sup.proc.wait(timeout=60)
            if sup.proc.returncode != 0:
                sup.bad_exits.append(f"stop: exit {sup.proc.returncode}: {result.stderr}")
            sup.proc = None
            sup.start()
        elif fault == "cancel":
            job_id = self.rng.choice(ids)
            if sup.cli("cancel", str(job_id), timeout=30).returncode == 0:
                self.cancelled.add(job_id)
        self.faults[fault] += 1

    def run(self) -> int:
        for sup in self.sups:
            sup.start()
        ids: list[int] = []
        began = time.monotonic()
        asking = threading.Thread(target=self.ask_on_demand, args=(began,), daemon=True)
        asking.start()
        while time.monotonic() - began < self.args.seconds:
            if len(ids) < self.args.jobs:
                ids += self.enqueue(min(self.args.jobs - len(ids), self.args.jobs // 10 or 1))
            time.sleep(self.rng.uniform(0.5, 3.0))
            try:
                self.strike(ids)
            except (psycopg.OperationalError, OSError, subprocess.SubprocessError) as exc:
                self.faults[f"fault failed: {type(exc).__name__}"] += 1
        asking.join()
        for sup in self.sups:
            for _ in range(30):
                if sup.alive():
                    break
                sup.reap()
                sup.start()
                time.sleep(1)
        if len(ids) < self.args.jobs:
            ids += self.enqueue(self.args.jobs - len(ids))
        statuses = self.wait_for_the_end(len(ids))
        for sup in self.sups:
            result = sup.cli("stop", "--timeout", "30")
            sup.proc.wait(timeout=90)
            if sup.proc.returncode != 0:
                sup.bad_exits.append(f"final stop: exit {sup.proc.returncode}: {result.stderr}")
        return self.check(ids, statuses)

    def ask_on_demand(self, began: float) -> None:
        """Users waiting on on-demand requests all through the faults: each must end in a
        result (exit 0), or one line saying why not (exit 1), within its --timeout."""
        rng = random.Random(self.args.seed + 1)
        asked_n = 0
        while time.monotonic() - began < self.args.seconds:
            sup = rng.choice(self.sups)
            asked_n += 1
            payload = {"dir": str(self.folder), "seconds": rng.uniform(0.01, 0.2), "fail": 0,
                       "lock": f"od-{asked_n}"}
            asked = time.monotonic()
            try:
                result = sup.cli("submit", rng.choice("abc"), "--on-demand", "--timeout", "20",
                                 "--payload", json.dumps(payload), timeout=60)
            except subprocess.TimeoutExpired:
                self.on_demand_problems.append("an on-demand request still waited after 60 s")
                continue
            took = time.monotonic() - asked
            if result.returncode == 0 and '"id"' in result.stdout:
                self.on_demand["answered"] += 1
            elif result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1:
                self.on_demand[result.stderr.strip()[:70]] += 1
            else:
                self.on_demand_problems.append(
                    f"on-demand request: exit {result.returncode}: {result.stderr.strip()[-500:]}")
            if took > 20 + 15:
                self.on_demand_problems.append(f"an on-demand request took {took:.0f} s")
            time.sleep(rng.uniform(0.05, 0.5))

    def wait_for_the_end(self, n: int) -> dict[int, str]:
        deadline = time.monotonic() + 300
        while True:
            try:
                with psycopg.connect(self.url, autocommit=True) as conn:
                    rows = dict(conn.execute("SELECT id, status FROM fairsched_jobs"))
            except psycopg.OperationalError:
                rows = {}
            if len(rows) >= n and all(s in FINAL for s in rows.values()):
                return rows
            if time.monotonic() > deadline:
                return rows
            time.sleep(0.5)

    def worker_logs(self) -> dict[int, Path]:
        """Each worker's pid: the log of the supervisor run that spawned it."""
        spawned = {}
        for sup in self.sups:
            for path in sup.folder.glob("supervisor-*.log"):
                for pid in re.findall(r" spawned \(pid (\d+)\)", path.read_text(errors="replace")):
                    spawned[int(pid)] = path
        return spawned

    def check(self, ids: list[int], statuses: dict[int, str]) -> int:
        runs = collections.Counter()
        first_run_by: dict[int, int] = {}
        overlaps = []
        log = self.folder / "runs.log"
        for line in (log.read_text().splitlines() if log.exists() else []):
            kind, job_id, _attempt, pid = line.split()
            if not job_id.isdigit():  # an on-demand request's
                if kind != "done":
                    overlaps.append(line)
                continue
            if kind == "done":
                runs[int(job_id)] += 1
                first_run_by.setdefault(int(job_id), int(pid))
            else:
                overlaps.append(line)
        problems = []
        # A side effect recorded twice is explained when the supervisor of its first run was
        # killed or frozen (its outcome lost): any other is a job run twice.
        disrupted = set().union(*(sup.disrupted for sup in self.sups))
        spawned = self.worker_logs()
        for job_id, n in runs.items():
            if n > 1 and spawned.get(first_run_by[job_id]) not in disrupted:
                problems.append(f"job {job_id} ran {n} times, its first run's supervisor "
                                "neither killed nor frozen")
        by_status = collections.Counter(statuses.values())
        for job_id in ids:
            status = statuses.get(job_id)
            if status == "succeeded" and not runs[job_id]:
                problems.append(f"job {job_id} succeeded but its side effect is missing")
            elif status == "cancelled" and job_id not in self.cancelled:
                problems.append(f"job {job_id} cancelled, never asked to be")
            elif status not in ("succeeded", "cancelled"):
                problems.append(f"job {job_id} ended {status}")
        problems += [f"two runs of one job at once: {line}" for line in overlaps]
        problems += self.on_demand_problems
        for sup in self.sups:
            problems += [f"{sup.folder.name}: {e}" for e in sup.bad_exits]
            for path in sorted(sup.folder.glob("supervisor-*.log")):
                text = path.read_text(errors="replace")
                if "Traceback" in text:
                    problems.append(f"{path}: holds a traceback")
        twice = sum(1 for n in runs.values() if n > 1)
        print(f"faults: {dict(self.faults)}")
        print(f"on-demand requests: {dict(self.on_demand)}")
        print(f"jobs: {len(ids)}; ended {dict(by_status)}; side effects recorded more than "
              f"once: {twice} (outcomes lost with a killed or frozen supervisor)")
        for problem in problems[:50]:
            print("PROBLEM:", problem)
        print(f"{len(problems)} problems" if problems else "every invariant held")
        return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--supervisors", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--folder", default=None,
                        help="where to make the drill's folder (default: the system's temp)")
    parser.add_argument("--keep", action="store_true", help="keep the folder afterwards")
    args = parser.parse_args()
    if args.seed is None:
        args.seed = random.randrange(2**32)
    print(f"seed {args.seed}")
    folder = Path(tempfile.mkdtemp(prefix="fs-chaos-", dir=args.folder))
    (folder / "locks").mkdir(mode=0o777)
    (folder / "chaos_handlers.py").write_text(textwrap.dedent(HANDLER))
    pg = Cluster(folder / "pg")
    pg.prepare()
    pg.start()
    rc = 1
    try:
        url = pg.url()
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
        rc = Drill(args, folder, pg, url).run()
    finally:
        for proc in subprocess.run(["pgrep", "-f", f"--config {folder}"], capture_output=True,
                                   text=True).stdout.split():
            os.kill(int(proc), signal.SIGKILL)
        pg.stop()
        if rc == 0 and not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            print(f"kept {folder}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
