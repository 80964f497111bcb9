"""Benchmark one whole scheduling cycle of the actor beside the core's plan_cycle alone.

The actor (fairsched.supervisor.actor.Supervisor, not started: no worker process, no
database) gets its planner's slot pool filled and its candidates as a fetch leaves them
(Planner.fetched); then the planner's _cycle() is timed: the candidate cache plans, the placed
jobs leave it, and their claims go to the queue link. Between cycles, untimed, the claims come
back lost (Planner.claimed), which frees their slots, and the fetch is answered again. Beside it,
core.plan_cycle plans the same candidates, given as a core.Candidates, on a pool of the same
slots. The candidates are queued jobs only: an on-demand job placed would start on a worker.
Both cores, side by side in one process; the last line is the ratio of the medians at
2000 x 1000 with the compiled core. Run with `make bench-all`, or with --quick for a smoke run.
"""

import asyncio
import statistics
import sys
import time
from pathlib import Path

from _common import start
from bench_core import workload

from fairsched.config import Config, SupervisorSettings, WorkerSpec
from fairsched.core import Candidates, Weights
from fairsched.store.rows import Candidate
from fairsched.supervisor.actor import Supervisor
from fairsched.supervisor.in_flight import Claims
from fairsched.supervisor.waiting import WaitingJobs

# (candidates, slots, job types, cycles to time)
SIZES = [(512, 256, 24, 200), (2000, 1000, 32, 100), (20000, 10000, 64, 30)]
QUICK_SIZES = [(32, 16, 8, 5), (128, 64, 16, 5), (2000, 1000, 32, 5)]
RATIO_AT = (2000, 1000)
CLOCK_OFFSET = 0.25  # the queue's clock ahead of this host's, seconds: as a fetch measures it


def type_name(type_id):
    # Zero-padded, so that the actor's interning (sorted names) gives back the same ids.
    return f"t{type_id:03d}"


async def _made(config):
    return Supervisor(config)  # on the running loop, as the supervisor makes it


class ActorBench:
    """A Supervisor of one core implementation with the workload's slots and candidates."""

    def __init__(self, ns, slots, cands, n_types, shift):
        spec = WorkerSpec(name="bench", types=tuple(type_name(t) for t in range(n_types)),
                          handler="bench:run", command=None)
        config = Config(path=Path("workers.toml"), supervisor=SupervisorSettings(
            state_dir=Path("bench-state")), scoring=Weights(), matching="greedy",
            workers=(spec,))
        # Made on a loop, and never run again: schedule() only queues a cycle on it.
        self.loop = asyncio.new_event_loop()
        sup = self.loop.run_until_complete(_made(config))
        self.planner = planner = sup.planner
        planner.pool = ns.SlotPool()
        planner.waiting = WaitingJobs(planner.type_ids, ns.CandidateCache())
        sup.queue.clock_offset = CLOCK_OFFSET
        self.queue = sup.queue
        for slot_id, worker, types in slots:
            planner.pool.add_slot(slot_id, worker, types)
        # The queue's clock: eligible_at as the fetch reads it from the table.
        self.rows = [Candidate(job_id, type_name(t), p, e + shift + CLOCK_OFFSET)
                     for t, p, e, job_id in zip(cands.types, cands.priorities,
                                                cands.eligible_at, cands.job_ids, strict=True)]
        self.wanted = planner.free_by_type()
        planner.fetched(self.rows, self.wanted)

    def cycle(self):
        """Microseconds of one _cycle(), then (untimed) the claims lost and the fetch again."""
        planner = self.planner
        start = time.perf_counter_ns()
        planner._cycle()
        took = (time.perf_counter_ns() - start) / 1000.0
        # As the queue link hands them back when their statement never ran.
        claims, self.queue.claims = self.queue.claims, Claims()
        placed = len(claims)
        planner.claimed(claims, {}, contested=False)
        planner.fetched(self.rows, self.wanted)
        return took, placed

    def close(self):
        self.loop.close()


class CoreBench:
    """core.plan_cycle alone on the same candidates and slots, as scripts/bench_core.py."""

    def __init__(self, ns, slots, cands, shift):
        self.ns = ns
        self.pool = ns.SlotPool()
        for slot_id, worker, types in slots:
            self.pool.add_slot(slot_id, worker, types)
        self.cands = Candidates.from_lists(cands.types, cands.priorities,
                                           [e + shift for e in cands.eligible_at],
                                           [0] * len(cands), cands.job_ids)
        self.weights = Weights()

    def cycle(self):
        start = time.perf_counter_ns()
        _, slot_ids = self.ns.plan_cycle(self.pool, self.cands, time.time(), self.weights)
        took = (time.perf_counter_ns() - start) / 1000.0
        for slot_id in slot_ids:
            self.pool.release(slot_id)
        return took, len(slot_ids)


def measure(ns, size, block=5):
    """Median microseconds per cycle: (whole actor cycle, plan_cycle alone), jobs placed.

    The two run in alternating blocks of `block` cycles, so both are timed in the steady state
    of a busy scheduler and any drift in machine load hits both alike."""
    n_cands, n_slots, n_types, cycles = size
    slots, cands, now = workload(n_cands, n_slots, n_types)
    shift = time.time() - now  # eligible times of today, as the actor plans at time.time()
    actor = ActorBench(ns, slots, cands, n_types, shift)
    alone = CoreBench(ns, slots, cands, shift)
    samples = {"e2e": [], "core": []}
    placed = {"e2e": set(), "core": set()}
    try:
        for _ in range(max(1, cycles // block)):
            for name, bench in (("e2e", actor), ("core", alone)):
                for _ in range(block):
                    took, n = bench.cycle()
                    samples[name].append(took)
                    placed[name].add(n)
    finally:
        actor.close()
    # The same candidates on the same slots: every cycle places as many either way.
    if len(placed["e2e"] | placed["core"]) != 1 or 0 in placed["e2e"]:
        raise SystemExit(f"error: at {n_cands} x {n_slots} the actor's cycles placed "
                         f"{sorted(placed['e2e'])} jobs, plan_cycle {sorted(placed['core'])}")
    return statistics.median(samples["e2e"]), statistics.median(samples["core"]), n


def main(argv=None):
    args, impls = start(__doc__, "tiny sizes and 2000 x 1000, few cycles, for a smoke run", argv)
    if impls is None:
        return 1
    print(f"python {sys.version.split()[0]}; e2e = the actor's _cycle() (candidate cache, "
          "plan, claims handed to the queue link); core = plan_cycle alone; median of N cycles")
    header = (f"{'cands x slots':>14} {'types':>5} {'placed':>6} {'N':>4} {'c e2e us':>10} "
              f"{'c core us':>10} {'c e2e/core':>10} {'py e2e us':>11} {'py core us':>11} "
              f"{'py e2e/core':>11}")
    print(header)
    print("-" * len(header))
    ratio = None
    for size in QUICK_SIZES if args.quick else SIZES:
        n_cands, n_slots, n_types, cycles = size
        c_e2e, c_core, placed = measure(impls["c"], size)
        py_e2e, py_core, _ = measure(impls["py"], size)
        if (n_cands, n_slots) == RATIO_AT:
            ratio = c_e2e / c_core
        print(f"{n_cands:>7} x {n_slots:<5} {n_types:>5} {placed:>6} {cycles:>4} {c_e2e:>10.1f} "
              f"{c_core:>10.1f} {c_e2e / c_core:>9.2f}x {py_e2e:>11.1f} {py_core:>11.1f} "
              f"{py_e2e / py_core:>10.2f}x")
    print(f"e2e/core at {RATIO_AT[0]} x {RATIO_AT[1]}: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
