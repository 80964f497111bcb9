"""Benchmark the scheduling core: one planning cycle (score + plan), compiled vs twin.

Both implementations run side by side in one process on the same workloads; the table
shows the median time per cycle, the speed ratio, the time per candidate, and how the
compiled cycle's cost grew from the size before against n log n. Run with `make bench`, or
with --quick for a smoke run.
"""

import math
import random
import statistics
import sys
import time

from _common import start

from fairsched.core import Candidates, Weights

# (candidates, slots, job types, cycles to time)
SIZES = [(32, 16, 16, 400), (512, 256, 24, 200), (2000, 1000, 32, 100), (20000, 10000, 64, 30)]
OUTLIER_SIZE = SIZES[2]


def type_set(rng, n_types, popularity):
    # 60% specialists, 30% with 2-3 types, 10% versatile with 4-8 types.
    roll = rng.random()
    k = 1 if roll < 0.6 else rng.randint(2, 3) if roll < 0.9 else rng.randint(4, 8)
    chosen = set()
    while len(chosen) < k:
        chosen.add(rng.choices(range(n_types), popularity)[0])
    return sorted(chosen)


def workload(n_cands, n_slots, n_types, seed=1):
    """Workers of 1-4 slots each (slots of one worker share its types), and candidates."""
    rng = random.Random(seed)
    # A few popular types and a long tail of rare ones.
    popularity = [1.0 / (rank + 1) for rank in range(n_types)]
    slots = []
    worker = 0
    while len(slots) < n_slots:
        types = type_set(rng, n_types, popularity)
        for _ in range(min(rng.randint(1, 4), n_slots - len(slots))):
            slots.append((len(slots), worker, types))
        worker += 1
    now = 1_000_000.0
    cands = Candidates()
    for job_id in range(n_cands):
        cands.append(
            rng.choices(range(n_types), popularity)[0],
            min(10, int(rng.expovariate(0.4))),
            now - rng.expovariate(1 / 60.0),
            rng.random() < 0.05,
            job_id,
        )
    return slots, cands, now


def build_pool(ns, slots):
    pool = ns.SlotPool()
    for slot_id, worker, types in slots:
        pool.add_slot(slot_id, worker, types)
    return pool


def time_cycles(impls, slots, cands, now, cycles, block=5):
    """Median microseconds per cycle for each implementation.

    Each implementation runs `block` consecutive cycles in turn, so both are timed in the
    steady state of a busy scheduler rather than just after the other one flushed the CPU
    caches, and any drift in machine load hits both alike.
    """
    weights = Weights()
    pools = {name: build_pool(ns, slots) for name, ns in impls.items()}
    samples = {name: [] for name in impls}
    plans = {}
    for _ in range(max(1, cycles // block)):
        for name, ns in impls.items():
            pool = pools[name]
            for _ in range(block):
                start = time.perf_counter_ns()
                idx, slot_ids = ns.plan_cycle(pool, cands, now, weights)
                samples[name].append((time.perf_counter_ns() - start) / 1000.0)
                # Give the reserved slots back, outside the timing, so every cycle starts alike.
                for slot_id in slot_ids:
                    pool.release(slot_id)
            plans[name] = (list(idx), list(slot_ids))
    first = next(iter(plans.values()))
    if any(plan != first for plan in plans.values()):
        raise SystemExit("error: the implementations planned differently")
    return {name: statistics.median(s) for name, s in samples.items()}, len(first[0])


def skewed(cands, now, age):
    """The same candidates plus one job of type 0 that has waited `age` seconds."""
    return Candidates.from_lists([*cands.types, 0], [*cands.priorities, 0],
                                 [*cands.eligible_at, now - age], [*cands.on_demand, 0],
                                 [*cands.job_ids, len(cands)])


def outlier_table(impls, size, slots, cands, now, cycles):
    """One far older job stretches the range of the scores; the cycle should barely notice."""
    n_cands, n_slots, n_types, _ = size
    print(f"\n{n_cands} x {n_slots}, {n_types} types, with one job far older than the rest")
    header = f"{'oldest job':>14} {'c us':>10} {'py us':>11} {'ratio':>7} {'c vs none':>10}"
    print(header)
    print("-" * len(header))
    base = None
    for label, age in [("(none)", None), ("1 day", 86400.0), ("1 year", 365 * 86400.0)]:
        trial = cands if age is None else skewed(cands, now, age)
        medians, _ = time_cycles(impls, slots, trial, now, cycles)
        c_us, py_us = medians["c"], medians["py"]
        base = base or c_us
        print(f"{label:>14} {c_us:>10.1f} {py_us:>11.1f} {py_us / c_us:>6.1f}x "
              f"{c_us / base:>9.2f}x")


def main(argv=None):
    args, impls = start(__doc__, "few cycles, for a smoke run", argv)
    if impls is None:
        return 1
    print(f"python {sys.version.split()[0]}; one cycle = score + plan_cycle; median of N cycles, "
          "run in alternating blocks of 5")
    header = (f"{'cands x slots':>14} {'types':>5} {'placed':>6} {'N':>4} {'c us':>10} "
              f"{'py us':>11} {'ratio':>7} {'c us/cand':>10} {'py us/cand':>11} "
              f"{'c growth':>9}")
    print(header)
    print("-" * len(header))
    previous = None  # (c us, n log n) of the row before
    outliers = None  # the workload the outlier table adds a far older job to
    for size in SIZES:
        n_cands, n_slots, n_types, cycles = size
        if args.quick:
            cycles = max(5, cycles // 20)
        slots, cands, now = workload(n_cands, n_slots, n_types)
        if size == OUTLIER_SIZE:
            outliers = (size, slots, cands, now, cycles)
        medians, placed = time_cycles(impls, slots, cands, now, cycles)
        c_us, py_us = medians["c"], medians["py"]
        # The compiled cycle's growth from the row before, over what n log n would give
        # (n = candidates + slots): 1.00 or less is growth no faster than n log n.
        n_log_n = (n_cands + n_slots) * math.log2(n_cands + n_slots)
        growth = "" if previous is None else f"{c_us / previous[0] / (n_log_n / previous[1]):.2f}"
        previous = (c_us, n_log_n)
        print(f"{n_cands:>7} x {n_slots:<5} {n_types:>5} {placed:>6} {cycles:>4} {c_us:>10.1f} "
              f"{py_us:>11.1f} {py_us / c_us:>6.1f}x {c_us / n_cands:>10.3f} "
              f"{py_us / n_cands:>11.3f} {growth:>9}")
    outlier_table(impls, *outliers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
