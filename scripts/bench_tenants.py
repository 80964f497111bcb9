"""What tenants cost: the throughput of no-op jobs spread over many tenants beside the same
jobs with none, measured in one run.

    .venv/bin/python scripts/bench_tenants.py [--jobs 20000] [--tenants 20] [--processes 2]
                                              [--slots 512] [--rounds 3]

Each round runs the two setups one after the other (interleaved, so that any drift of the
machine hits both), each on a fresh database of the same PostgreSQL server
(scripts/bench_throughput.py's machinery: enqueue, VACUUM ANALYZE, start the supervisor, poll
until every job succeeded; seconds on the server's clock). With tenants, job i is tenant
`t<i mod N>`'s: each fetch reads the best jobs of each of the N tenants, and each completion
batch adds to N usage rows. The throughput of each setup is its best round; the last line is
the cost: 1 - (jobs/s with tenants) / (jobs/s without), in percent. Uses
FAIRSCHED_DATABASE_URL when set, else an embedded PostgreSQL in a temporary directory.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import psycopg
from bench_throughput import (
    Fairsched,
    Options,
    batches,
    interleaved,
    positive_int,
    postgres_server,
    print_best_rounds,
)


class WithTenants(Fairsched):
    name = "fairsched-tenants"
    tenants = 20

    def prepare(self, url, opts):
        from fairsched.store.queue import Queue
        from fairsched.store.schema import migrate

        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
            queue = Queue(conn)
            done = 0
            for size in batches(opts.jobs):
                queue.enqueue_many([{"type": "noop", "payload": opts.payload,
                                     "tenant": f"t{(done + i) % self.tenants}"}
                                    for i in range(size)])
                done += size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=positive_int, default=20000,
                        help="no-op jobs per run (default 20000)")
    parser.add_argument("--tenants", type=positive_int, default=20,
                        help="tenants the jobs are spread over (default 20)")
    parser.add_argument("--processes", type=positive_int, default=2,
                        help="worker processes (default 2)")
    parser.add_argument("--slots", type=positive_int, default=512,
                        help="slots per process (default 512)")
    parser.add_argument("--rounds", type=positive_int, default=3,
                        help="interleaved rounds of the two setups (default 3)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="fsbn-", dir="/tmp"))
    plain, tenants = Fairsched(), WithTenants()
    tenants.tenants = args.tenants
    try:
        with postgres_server(folder) as (server, kind):
            opts = Options(args.jobs, args.processes, args.slots, folder)
            print(f"{args.jobs} no-op jobs, {args.processes} processes x {args.slots} slots, "
                  f"PostgreSQL ({kind}); {args.rounds} rounds")
            results = interleaved([plain, tenants], server, "bench_tenants", opts, args.rounds)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    best = print_best_rounds(results, {plain.name: "fairsched",
                                       tenants.name: f"fairsched, {args.tenants} tenants"})
    cost = 1 - best[tenants.name].rate / best[plain.name].rate
    print(f"throughput cost of tenants: {cost * 100:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
