"""What recycling costs: the gap a recycled process leaves, and the throughput of a no-op
workload with `max_jobs = 100` beside the same without recycling, measured in one run.

    .venv/bin/python scripts/bench_recycle.py [--jobs 6000] [--processes 4] [--rounds 3] [--max-jobs 100]

Each round runs the two setups one after the other (interleaved, so that any drift of the
machine hits both), each on a fresh database of the same PostgreSQL server, with the same
no-op handler (scripts/bench_throughput.py's machinery: enqueue, VACUUM ANALYZE, start the
supervisor, poll until every job succeeded; seconds on the server's clock). The gap of each
recycle is read from the supervisor's JSON log: from `worker_recycled` (the process took its
last job, its slots left the pool) to `worker_ready` of its replacement, forked from the
group's template. Its p50 and p99 are over every recycle of every round; the throughput of
each setup is its best round. Then the cost: 1 - (jobs/s with max_jobs) / (jobs/s without),
in percent, of the best rounds (the target is at most 5) and of the median rounds. Last, what a busy machine hardly moves: the CPU time the
supervisor, its workers (exited ones included) and PostgreSQL spent per job, both setups, and
what that makes per recycle. Uses FAIRSCHED_DATABASE_URL when set, else an embedded
PostgreSQL in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from bench_throughput import (
    Fairsched,
    Options,
    interleaved,
    positive_int,
    postgres_server,
    print_best_rounds,
)


class Plain(Fairsched):
    # The same log as the recycling setup's (JSON, every job's lines), which the gaps are
    # read from: the two differ only in max_jobs.
    log_args = ("--log-format", "json")


class Recycling(Plain):
    name = "fairsched-max-jobs"

    def __init__(self, max_jobs: int):
        self.max_jobs = max_jobs
        self.worker_settings = f"max_jobs = {max_jobs}\n"


def gaps(log: Path) -> list[float]:
    """Seconds from each worker_recycled to its replacement's worker_ready, in the log."""
    recycled: dict[str, datetime] = {}
    found = []
    for line in log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        event, worker = entry.get("event"), entry.get("worker")
        when = datetime.fromisoformat(entry["time"].replace("Z", "+00:00"))
        if event == "worker_recycled":
            recycled[worker] = when
        elif event == "worker_ready" and worker in recycled:
            found.append((when - recycled.pop(worker)).total_seconds())
    return found


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=positive_int, default=6000,
                        help="no-op jobs per run (default 6000)")
    parser.add_argument("--processes", type=positive_int, default=4,
                        help="worker processes, one slot each (default 4)")
    parser.add_argument("--max-jobs", type=positive_int, default=100,
                        help="max_jobs of the recycling setup (default 100)")
    parser.add_argument("--rounds", type=positive_int, default=3,
                        help="interleaved rounds of the two setups (default 3)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="fsbr-", dir="/tmp"))
    plain, recycling = Plain(), Recycling(args.max_jobs)
    every_gap: list[float] = []

    def read_gaps(setup) -> None:
        if setup is recycling:
            every_gap.extend(gaps(setup.log))

    try:
        with postgres_server(folder) as (server, kind):
            opts = Options(args.jobs, args.processes, 1, folder)
            print(f"{args.jobs} no-op jobs, {args.processes} processes x 1 slot, PostgreSQL "
                  f"({kind}); {args.rounds} rounds")
            results = interleaved([plain, recycling], server, "bench_recycle", opts,
                                  args.rounds, after=read_gaps)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    labels = {plain.name: plain.name,
              recycling.name: f"{plain.name} max_jobs = {recycling.max_jobs}"}
    best = print_best_rounds(results, labels)
    expected = args.rounds * args.jobs // recycling.max_jobs
    if not every_gap:
        print("error: no recycle seen in the log", file=sys.stderr)
        return 1
    print(f"recycles: {len(every_gap)} (about {expected} expected); replacement gap "
          f"p50 {percentile(every_gap, 0.5) * 1000:.1f} ms, p99 "
          f"{percentile(every_gap, 0.99) * 1000:.1f} ms, max {max(every_gap) * 1000:.1f} ms, "
          f"mean {statistics.mean(every_gap) * 1000:.1f} ms")
    cost = 1 - best[recycling.name].rate / best[plain.name].rate
    # The rounds of one setup spread by a tenth or more on a 2-core machine: the median
    # rounds' cost is printed beside the best rounds'.
    median = {name: statistics.median(r.rate for r in runs) for name, runs in results.items()}
    typical = 1 - median[recycling.name] / median[plain.name]
    print(f"throughput cost of max_jobs = {recycling.max_jobs}: {cost * 100:.1f}% "
          f"(best rounds; median rounds {typical * 100:.1f}%)")
    # What another load on the machine hardly moves: the CPU the supervisor, its workers
    # (exited ones too) and PostgreSQL spent per job, over every round.
    per_job = {name: [r.own_seconds / r.jobs for r in runs if r.own_seconds is not None]
               for name, runs in results.items()}
    if all(per_job.values()):
        cpu = {name: statistics.median(values) for name, values in per_job.items()}
        extra = cpu[recycling.name] / cpu[plain.name] - 1
        recycles = len(every_gap) / args.rounds
        spent = (cpu[recycling.name] - cpu[plain.name]) * args.jobs / recycles
        print(f"CPU per job (supervisor, workers, PostgreSQL; median of the rounds): "
              f"{cpu[plain.name] * 1e6:.0f} us, with max_jobs = {recycling.max_jobs} "
              f"{cpu[recycling.name] * 1e6:.0f} us: {extra * 100:+.1f}%, "
              f"{spent * 1e3:.1f} ms a recycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
