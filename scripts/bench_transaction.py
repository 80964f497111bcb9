"""What job.transaction() costs: the throughput of a no-op handler that commits its job's
success in its own transaction beside the same no-op handler without one, measured in one run.

    .venv/bin/python scripts/bench_transaction.py [--jobs 4000] [--processes 4] [--slots 4]
                                                  [--rounds 3]

Each round runs the two setups one after the other (interleaved, so that any drift of the
machine hits both), each on a fresh database of the same PostgreSQL server
(scripts/bench_throughput.py's machinery: enqueue, VACUUM ANALYZE, start the supervisor, poll
until every job succeeded; seconds on the server's clock). The transactional handler is
`with job.transaction(): pass`: a transaction per job on its slot's connection, whose one
statement marks the job succeeded, where the plain handler's success is written by the
supervisor, many jobs to a statement. The throughput of each setup is its best round; the last
line is the cost: 1 - (jobs/s transactional) / (jobs/s plain), in percent. Uses
FAIRSCHED_DATABASE_URL when set, else an embedded PostgreSQL in a temporary directory.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from bench_throughput import (
    Fairsched,
    Options,
    interleaved,
    positive_int,
    postgres_server,
    print_best_rounds,
)


class Transactional(Fairsched):
    name = "fairsched-transaction"
    handler_code = '''
def noop(job):
    with job.transaction():
        pass
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=positive_int, default=4000,
                        help="no-op jobs per run (default 4000)")
    parser.add_argument("--processes", type=positive_int, default=4,
                        help="worker processes (default 4)")
    parser.add_argument("--slots", type=positive_int, default=4,
                        help="slots per process, each a connection when transactional "
                             "(default 4)")
    parser.add_argument("--rounds", type=positive_int, default=3,
                        help="interleaved rounds of the two setups (default 3)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="fsbt-", dir="/tmp"))
    plain, transactional = Fairsched(), Transactional()
    try:
        with postgres_server(folder) as (server, kind):
            opts = Options(args.jobs, args.processes, args.slots, folder)
            print(f"{args.jobs} no-op jobs, {args.processes} processes x {args.slots} slots, "
                  f"PostgreSQL ({kind}); {args.rounds} rounds")
            results = interleaved([plain, transactional], server, "bench_transaction", opts,
                                  args.rounds)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    best = print_best_rounds(results, {plain.name: "fairsched",
                                       transactional.name: "fairsched job.transaction()"})
    cost = 1 - best[transactional.name].rate / best[plain.name].rate
    print(f"throughput cost of job.transaction(): {cost * 100:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
