"""Simulator speed on a long trace, and the cost of optimal vs greedy matching per cycle.

    .venv/bin/python scripts/bench_sched.py [--jobs 1000000] [--policy NAME ...]
                                            [--candidates 2000] [--slots 1000] [--repeat 5]

Part 1 writes a random_load trace of --jobs jobs (0.95 of the office pool's capacity), reads
it back as `fairsched simulate` does, and replays it under each policy: simulated events
(arrivals + completions) per second of wall time. Part 2 plans one cycle of --candidates jobs
over --slots free slots (random overlapping type sets over 20 types), greedy and optimal,
compiled and pure Python, on fresh pools: milliseconds per cycle and jobs placed, once with
every type equally common and once with a few popular types (where greedy strands some).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fairsched import core
from fairsched.config import load_config
from fairsched.core import _matching_py, _pool_py
from fairsched.sched import simulate as sim
from fairsched.sched import traces


def bench_simulator(n_jobs: int, policies: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="fs-bench-") as tmp:
        began = time.perf_counter()
        scenario = traces.random_load(n_jobs)
        trace_path, workers_path = scenario.write(Path(tmp))
        generated = time.perf_counter() - began
        config = load_config(workers_path)
        type_ids = sim.type_ids_of(config)
        began = time.perf_counter()
        trace = traces.read_trace(trace_path, type_ids)
        read = time.perf_counter() - began
        slots = sim.slot_layout(config, type_ids)
    print(f"simulator: {n_jobs:,} jobs on {len(slots)} slots, core {core.__impl__}; trace "
          f"generated and written in {generated:.1f} s, read and checked in {read:.1f} s "
          f"({n_jobs / read:,.0f} lines/s)")
    print(f"{'POLICY':<10} {'EVENTS':>10} {'CYCLES':>10} {'WALL S':>8} {'EVENTS/S':>10} "
          f"{'STRANDED':>9} {'MAKESPAN S':>12}")
    for policy in policies:
        r = sim.simulate(trace, slots, config.scoring, policy)
        print(f"{policy:<10} {r.events:>10,} {r.cycles:>10,} {r.wall_seconds:>8.1f} "
              f"{r.events_per_second:>10,.0f} {sum(r.stranded):>9,} {r.makespan:>12,.0f}")
    print()


def cycle_inputs(n_cands: int, n_slots: int, skew: float, n_types: int = 20, seed: int = 1):
    """Slots with 1-3 random types; candidate types Zipf-distributed with exponent `skew`."""
    rng = random.Random(seed)
    slots = [tuple(rng.sample(range(n_types), rng.choice((1, 2, 2, 3)))) for _ in range(n_slots)]
    now = 10_000.0
    popularity = [1.0 / (k + 1) ** skew for k in range(n_types)]
    cands = core.Candidates.from_lists(
        rng.choices(range(n_types), weights=popularity, k=n_cands),
        [rng.randrange(11) for _ in range(n_cands)],
        [now - rng.uniform(0, 600) for _ in range(n_cands)],
        [rng.random() < 0.05 for _ in range(n_cands)],
        list(range(n_cands)))
    return slots, cands, now


def bench_matching(n_cands: int, n_slots: int, repeat: int, skew: float) -> None:
    slots, cands, now = cycle_inputs(n_cands, n_slots, skew)
    weights = core.Weights()
    impls = [("py", _pool_py.SlotPool, _matching_py)]
    compiled = core.implementations()["c"]
    if compiled is not None:
        from fairsched.core import _matching_c, _pool_c

        impls.insert(0, ("c", _pool_c.SlotPool, _matching_c))
    else:
        print(f"(compiled core not loaded: {core.compiled_error()})")

    def fresh(pool_cls):
        pool = pool_cls()
        for sid, types in enumerate(slots):
            pool.add_slot(sid, sid, types)
        return pool

    mix = "uniform candidate types" if skew == 0 else f"Zipf({skew:g}) candidate types"
    print(f"one cycle: {n_cands:,} candidates, {n_slots:,} free slots over 20 types, {mix}; "
          f"median of {repeat} runs on fresh pools")
    print(f"{'IMPL':<5} {'GREEDY MS':>10} {'OPTIMAL MS':>11} {'OPT/GREEDY':>11} "
          f"{'PLACED GREEDY':>14} {'PLACED OPTIMAL':>15}")
    rows = {}
    for name, pool_cls, matching in impls:
        times = {}
        placed = {}
        for label, plan in (("greedy", matching.plan_cycle), ("optimal", matching.plan_optimal)):
            runs = []
            for _ in range(repeat):
                pool = fresh(pool_cls)
                began = time.perf_counter()
                idx, _ = plan(pool, cands, now, weights)
                runs.append(time.perf_counter() - began)
            times[label] = statistics.median(runs) * 1e3
            placed[label] = len(idx)
        rows[name] = times
        print(f"{name:<5} {times['greedy']:>10.2f} {times['optimal']:>11.2f} "
              f"{times['optimal'] / times['greedy']:>11.1f} {placed['greedy']:>14,} "
              f"{placed['optimal']:>15,}")
    if "c" in rows:
        print(f"compiled vs pure Python: greedy x{rows['py']['greedy'] / rows['c']['greedy']:.0f},"
              f" optimal x{rows['py']['optimal'] / rows['c']['optimal']:.0f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000,
                        help="jobs in the simulated trace (default 1,000,000; 0 skips part 1)")
    parser.add_argument("--policy", action="append", choices=sim.POLICIES,
                        help="policies to replay (default: all four)")
    parser.add_argument("--candidates", type=int, default=2000)
    parser.add_argument("--slots", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    if args.jobs < 0 or args.candidates < 1 or args.slots < 1 or args.repeat < 1:
        parser.error("--jobs must be >= 0; --candidates, --slots and --repeat >= 1")
    if args.jobs:
        bench_simulator(args.jobs, args.policy or list(sim.POLICIES))
    for skew in (0.0, 1.5):
        bench_matching(args.candidates, args.slots, args.repeat, skew)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
