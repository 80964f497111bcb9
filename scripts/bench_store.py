"""Job-store throughput on a real PostgreSQL, measured side by side in one run.

    .venv/bin/python scripts/bench_store.py [--url URL] [--jobs N] [--deep N] [--tenants N]

Without --url (or FAIRSCHED_DATABASE_URL) it runs on a throwaway embedded server. It prints
jobs/s for batched enqueue, for claiming and completing one job per statement, and for the
supervisor's cycle (fetch 2 x 16 candidates, claim them in one statement, complete them in one),
then the same cycle with the jobs spread over --tenants tenants (a fetch reads each tenant's
best 32, all claimed and completed; a completion writes each tenant's usage row) and with the type under a [limits] limit
it never reaches (the claim's lock and count), each beside the plain cycle as a ratio; then
the latency of one fetch against a deep queue (--deep pending jobs of other types, and 1,000
of its own), without and with tenants.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

from fairsched.store.aqueue import AsyncStore
from fairsched.store.database import ENV_URL, open_database
from fairsched.store.queue import Queue

TYPE = "bench"
PPS = 64.0


def reset(database, jobs: int, pending_extra: int = 0, tenants: int = 0) -> None:
    with database.connect() as conn:
        conn.execute("TRUNCATE fairsched_jobs, fairsched_supervisors, fairsched_limit_holds,"
                     " fairsched_tenant_usage")
        queue = Queue(conn)
        for start in range(0, jobs, 1000):
            queue.enqueue_many([{"type": TYPE, "priority": i % 11,
                                 "tenant": f"t{i % tenants}" if tenants else None}
                                for i in range(start, min(jobs, start + 1000))])
        for start in range(0, pending_extra, 1000):
            queue.enqueue_many([{"type": f"other{i % 8}", "priority": i % 11}
                                for i in range(start, min(pending_extra, start + 1000))])
        conn.execute("VACUUM ANALYZE fairsched_jobs")


def bench_enqueue(database, jobs: int) -> float:
    with database.connect() as conn:
        conn.execute("TRUNCATE fairsched_jobs")
        queue = Queue(conn)
        batch = [{"type": TYPE, "payload": {"n": i}, "priority": i % 11} for i in range(1000)]
        start = time.perf_counter()
        for _ in range(jobs // 1000):
            queue.enqueue_many(batch)
        return (jobs // 1000) * 1000 / (time.perf_counter() - start)


async def bench_one_by_one(url: str, jobs: int) -> float:
    store = await AsyncStore.connect(url)
    try:
        candidates = await store.fetch({TYPE: jobs // 2}, PPS)
        start = time.perf_counter()
        for job in candidates:
            (won,) = await store.claim([job.id], {TYPE: 3})
            await store.complete([(won.id, won.claim, None)])
        return len(candidates) / (time.perf_counter() - start)
    finally:
        await store.close()


async def bench_batched(url: str, jobs: int, free: int = 16, limits=None) -> float:
    store = await AsyncStore.connect(url)
    try:
        done = 0
        start = time.perf_counter()
        while done < jobs:
            candidates = await store.fetch({TYPE: free}, PPS)
            if not candidates:
                break
            # All of them, as the supervisor's cache would over its next cycles (with tenants
            # the fetch finds the best 2 x free of each tenant).
            ids = [j.id for j in candidates]
            if limits:
                won, _ = await store.claim_within(ids, {TYPE: 3}, limits)
            else:
                won = await store.claim(ids, {TYPE: 3})
            await store.complete([(j.id, j.claim, None) for j in won])
            done += len(won)
        return done / (time.perf_counter() - start)
    finally:
        await store.close()


async def bench_fetch_latency(url: str, rounds: int = 300) -> float:
    store = await AsyncStore.connect(url)
    try:
        start = time.perf_counter()
        for _ in range(rounds):
            await store.fetch({TYPE: 16, "other1": 4}, PPS)
        return (time.perf_counter() - start) / rounds * 1000
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="PostgreSQL URL (default: $FAIRSCHED_DATABASE_URL or embedded)")
    parser.add_argument("--jobs", type=int, default=20000, help="jobs per measurement")
    parser.add_argument("--deep", type=int, default=100_000,
                        help="pending jobs of other types behind the fetch latency")
    parser.add_argument("--tenants", type=int, default=20,
                        help="tenants the jobs are spread over in the tenant measurements")
    args = parser.parse_args()
    jobs = max(1000, args.jobs)
    deep = max(0, args.deep)

    tmp = None
    url = args.url or os.environ.get(ENV_URL)
    if not url:
        tmp = Path(tempfile.mkdtemp(prefix="fs-bench-"))
    database = open_database(tmp or Path("."), url)
    try:
        print(f"database: {database.kind}, {jobs} jobs per measurement")
        rate = bench_enqueue(database, jobs)
        print(f"enqueue_many, 1000 per batch:          {rate:10,.0f} jobs/s")
        reset(database, jobs)
        one = asyncio.run(bench_one_by_one(database.url, jobs))
        print(f"claim + complete, one job at a time:   {one:10,.0f} jobs/s")
        reset(database, jobs)
        batched = asyncio.run(bench_batched(database.url, jobs))
        print(f"fetch 32, claim 32, complete 32:       {batched:10,.0f} jobs/s"
              f"  ({batched / one:.1f}x one at a time)")
        n = max(1, args.tenants)
        reset(database, jobs, tenants=n)
        spread = asyncio.run(bench_batched(database.url, jobs))
        print(f"{f'the same, {n} tenants (32 each):':<39}{spread:10,.0f} jobs/s"
              f"  ({spread / batched:.2f}x without tenants)")
        reset(database, jobs)
        limited = asyncio.run(bench_batched(database.url, jobs, limits={TYPE: 1_000_000}))
        print(f"{'the same, type under [limits]:':<39}{limited:10,.0f} jobs/s"
              f"  ({limited / batched:.2f}x without a limit)")
        for spread_over in (0, n):
            reset(database, 0, pending_extra=deep, tenants=spread_over)
            with database.connect() as conn:
                Queue(conn).enqueue_many([{"type": TYPE, "priority": i % 11,
                                           "tenant": f"t{i % spread_over}" if spread_over
                                           else None} for i in range(1000)])
                conn.execute("VACUUM ANALYZE fairsched_jobs")
            latency = asyncio.run(bench_fetch_latency(database.url))
            label = (f"fetch with {deep + 1000:,} pending jobs"
                     + (f", {spread_over} tenants:" if spread_over else ":"))
            print(f"{label:<39}{latency:10.2f} ms per call")
    finally:
        database.close()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
