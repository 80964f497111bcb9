"""What the Python worker runtime costs per job: no-op jobs through one real worker process.

    .venv/bin/python scripts/bench_worker.py [--jobs 20000] [--slots 1 8 32 128]

The script plays the supervisor's part over the worker's socketpair: it fills every slot, and
each result it reads sends the next job to the slot just freed, in one write per read. For each
slot count it prints jobs per second and the worker's CPU time per job (user + system, from
psutil). Beside them, in the same run, the stdlib-only worker of examples/standalone_worker.py
(one slot, each job run inline on its only thread, with one progress frame) gives the cost
of the protocol alone.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fairsched.protocol import WORKER_MESSAGES, FrameDecoder, encode  # noqa: E402

STANDALONE = ROOT / "examples" / "standalone_worker.py"
HANDLER = "def noop(job):\n    return None\n"
INCARNATION = "bench-1"


def drive(command: list[str], slots: int, jobs: int, env: dict) -> tuple[float, float]:
    """(jobs per second, worker CPU microseconds per job) for `jobs` no-op jobs."""
    ours, theirs = socket.socketpair()
    env = dict(env, FAIRSCHED_FD=str(theirs.fileno()), FAIRSCHED_SLOTS=str(slots),
               FAIRSCHED_TYPES="noop", FAIRSCHED_WORKER="noop-1", FAIRSCHED_INCARNATION=INCARNATION)
    proc = subprocess.Popen(command, env=env, pass_fds=[theirs.fileno()])
    theirs.close()
    decoder = FrameDecoder(WORKER_MESSAGES)
    try:
        messages = []
        while not messages:
            messages = decoder.feed(ours.recv(1 << 16))
        if messages[0]["t"] != "hello":
            raise SystemExit(f"{command[-1]}: expected hello, got {messages[0]}")
        sent = 0

        def run(slot: int) -> bytes:
            nonlocal sent
            sent += 1
            return encode({"t": "run", "incarnation": INCARNATION, "slot": slot,
                           "job": {"id": sent, "type": "noop", "payload": None, "priority": 0,
                                   "attempt": 1, "on_demand": False}})

        worker = psutil.Process(proc.pid)
        before = worker.cpu_times()
        started = time.perf_counter()
        ours.sendall(b"".join(run(slot) for slot in range(min(slots, jobs))))
        done = 0
        while done < jobs:
            data = ours.recv(1 << 18)
            if not data:
                raise SystemExit(f"{command[-1]}: the worker exited after {done} jobs")
            more = []
            for msg in decoder.feed(data):
                if msg["t"] == "progress":
                    continue
                if msg["t"] != "result":
                    raise SystemExit(f"{command[-1]}: expected a result, got {msg}")
                done += 1
                if sent < jobs:
                    more.append(run(msg["slot"]))
            if more:
                ours.sendall(b"".join(more))
        elapsed = time.perf_counter() - started
        after = worker.cpu_times()
        cpu = (after.user + after.system) - (before.user + before.system)
        return jobs / elapsed, cpu / jobs * 1e6
    finally:
        ours.close()  # EOF: the worker leaves
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20000, help="no-op jobs per row (default 20000)")
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 8, 32, 128],
                        help="slot counts of the fairsched worker (default 1 8 32 128)")
    opts = parser.parse_args()
    if opts.jobs < 1 or any(n < 1 for n in opts.slots):
        parser.error("--jobs and --slots must be integers >= 1")
    with tempfile.TemporaryDirectory(prefix="fs-bench-") as folder:
        (Path(folder) / "bench_noop.py").write_text(HANDLER)
        pythonpath = os.pathsep.join(filter(None, [folder, os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, PYTHONPATH=pythonpath, FAIRSCHED_HANDLER="bench_noop:noop")
        rows = [(f"fairsched runtime, {n} slots", *drive(
            [sys.executable, "-m", "fairsched.worker", "--chdir", folder], n, opts.jobs, env))
            for n in opts.slots]
        rows.append(("standalone_worker.py, 1 slot",
                     *drive([sys.executable, str(STANDALONE)], 1, opts.jobs, env)))
    reference = rows[-1][2]
    print(f"{opts.jobs} no-op jobs per row, one worker process\n")
    print(f"{'worker':32s} {'jobs/s':>9s} {'cpu us/job':>11s} {'vs standalone':>14s}")
    for name, rate, per_job in rows:
        print(f"{name:32s} {rate:9.0f} {per_job:11.1f} {per_job / reference:13.2f}x")


if __name__ == "__main__":
    main()
