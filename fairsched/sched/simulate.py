"""Replay a job trace against the configured slots on a virtual clock, one policy at a time.

The clock jumps from event to event (arrivals and completions); after the events of one
instant, one planning cycle runs, as in the supervisor. The `fairsched` policy plans with
the supervisor's own core (core.SlotPool, core.plan_cycle), `optimal` with the core's
optimal matching; `fifo` (oldest first) and `priority` (strict priority, then oldest) order
the jobs themselves but take slots from the same pool, most specialised first.

Pending jobs wait in per-type heaps ordered the way the policy ranks jobs of one type, and
a cycle takes from each type only as many jobs as it has free slots: within one type the
placed jobs are always the best-ranked ones, so this is what the supervisor's bounded fetch
does, and it keeps a cycle's work proportional to the free slots, not to the backlog.
"""

from __future__ import annotations

import collections
import heapq
import math
import time
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fairsched import core
from fairsched.config import Config
from fairsched.core._matching_py import augment
from fairsched.sched.traces import MAX_SECONDS, MIN_TICK, Trace
from fairsched.store.schema import MAX_PRIORITY

heappop = heapq.heappop
# Unit roundoff of a double: each operation of the core's score, and of a heap key, is off by
# at most this much of its result.
ROUNDOFF = 2.0 ** -53

POLICIES = ("fairsched", "fifo", "priority", "optimal")
DEFAULT_POLICIES = ("fairsched", "fifo", "priority")


# -- the slots ---------------------------------------------------------------------------------

def type_ids_of(config: Config) -> dict[str, int]:
    """Type name -> type id, numbered as the supervisor numbers them."""
    return {t: i for i, t in enumerate(sorted(config.types))}


def slot_layout(config: Config, type_ids: Mapping[str, int]) -> list[tuple[int, ...]]:
    """Each configured slot's type ids: processes x slots of every [[worker]]."""
    slots = []
    for spec in config.workers:
        ids = tuple(type_ids[t] for t in spec.types)
        slots += [ids] * (spec.processes * spec.slots)
    return slots


# -- policies -----------------------------------------------------------------------------------

class _Policy:
    """How jobs of one type are ranked (heap keys) and how a cycle places its candidates."""

    name = ""
    split_on_demand = False  # fairsched ranks on-demand jobs of a type on their own slope
    split_tenants = False  # fairsched ranks each tenant's queued jobs of a type on their own
    near_ties = False  # keys are rounded scores: let the core order those within rounding

    def __init__(self, sim: Simulation):
        self.sim = sim

    def key(self, j: int) -> tuple:
        raise NotImplementedError

    def near_tie(self, on_demand: bool, now: float) -> float:
        """How far apart (in key units) two keys of one heap may be and still rank the other
        way in the core, whose scores are rounded differently; only with `near_ties`."""
        return 0.0

    def plan(self, picked: list[tuple], now: float, free) -> tuple[list, list]:
        """Place the picked heap entries; return (placed (job, slot) pairs, unplaced in rank order)."""
        raise NotImplementedError


class _FairschedPolicy(_Policy):
    name = "fairsched"
    split_on_demand = True
    split_tenants = True
    near_ties = True

    def __init__(self, sim: Simulation):
        super().__init__(sim)
        w = sim.weights
        # Within one type (same rarity bonus) the score order is the order of these keys.
        self.queued_slope = w.priority / w.age if w.age > 0 else None
        od_rate = w.age + w.on_demand_age
        self.od_slope = w.priority / od_rate if od_rate > 0 else None
        self.plan_cycle = self.planner()

    def key(self, j):
        s = self.sim
        slope = self.od_slope if s.on_demand[j] else self.queued_slope
        p = s.priorities[j]
        if slope is None:
            return (-p, s.at[j], j)
        # The priority is part of a run's identity (see _park): where p x slope is below the
        # float spacing of the arrival time, jobs of one arrival and different priorities
        # get one rounded key, yet the core scores them apart.
        return (s.at[j] - p * slope, s.at[j], -p, j)

    def near_tie(self, on_demand, now):
        slope = self.od_slope if on_demand else self.queued_slope
        if slope is None:
            return 0.0
        # Two jobs of one heap whose exact scores differ by d points have exact keys d / rate
        # apart. Each computed score is off by under 8 roundoffs of the largest score a job
        # of the heap can have at `now`, each computed key by under 4 of the largest key: keys
        # further apart than this rank alike in the core. A margin of 4 on top.
        w = self.sim.weights
        top = MAX_PRIORITY * w.priority + now * w.age + w.rarity + w.tenant
        rate = w.age
        if on_demand:
            top += now * w.on_demand_age + w.on_demand
            rate += w.on_demand_age
        return 64 * ROUNDOFF * (top / rate + now + MAX_PRIORITY * slope)

    def planner(self):
        # The supervisor's own planning: greedy, or optimal when [scoring] matching says so.
        return optimal_planner() if self.sim.matching == "optimal" else core.plan_cycle

    def plan(self, picked, now, free):
        s = self.sim
        if len(picked) == 1:
            # One candidate: scores cannot reorder anything, and the cycle's plan is the
            # pool's most specialised free slot for it, which acquire() returns directly.
            j = picked[0][-1]
            sid = s.pool.acquire(s.types[j])
            return ([(j, sid)], []) if sid >= 0 else ([], [j])
        js = [e[-1] for e in picked]
        # The trace was checked when it was read: fill the columns without checking again.
        cands = core.Candidates()
        cands.types = array("q", [s.types[j] for j in js])
        cands.priorities = array("q", [s.priorities[j] for j in js])
        cands.eligible_at = array("d", [s.at[j] for j in js])
        cands.on_demand = array("B", [s.on_demand[j] for j in js])
        cands.job_ids = array("q", js)
        if s.n_tenants > 1:
            # As the supervisor: each queued job's tenant, each tenant's share of the usage.
            cands.tenants = array("q", [-1 if s.on_demand[j] else s.tenants[j] for j in js])
            cands.tenant_shares = s.tenant_shares(now)
        else:
            cands.tenants = array("q", bytes(8 * len(js)))
        idx, slots = self.plan_cycle(s.pool, cands, now, s.weights)
        placed = [(js[i], sid) for i, sid in zip(idx, slots, strict=True)]
        if len(placed) == len(js):
            return placed, []
        taken = set(idx)
        _, ranked = core.score_candidates(cands, now, free, s.weights)
        return placed, [js[i] for i in ranked if i not in taken]


class _OptimalPolicy(_FairschedPolicy):
    name = "optimal"

    def planner(self):
        return optimal_planner()


class _FifoPolicy(_Policy):
    name = "fifo"

    def key(self, j):
        return (self.sim.at[j], j)

    def plan(self, picked, now, free):
        s = self.sim
        acquire = s.pool.acquire
        placed, unplaced = [], []
        for entry in sorted(picked):
            j = entry[-1]
            sid = acquire(s.types[j])
            if sid >= 0:
                placed.append((j, sid))
            else:
                unplaced.append(j)
        return placed, unplaced


class _PriorityPolicy(_FifoPolicy):
    name = "priority"

    def key(self, j):
        return (-self.sim.priorities[j], self.sim.at[j], j)


_POLICY_CLASSES = {p.name: p for p in (_FairschedPolicy, _OptimalPolicy, _FifoPolicy,
                                       _PriorityPolicy)}


def optimal_planner():
    """plan_optimal of the live core implementation (compiled or the twin)."""
    if core.__impl__ == "c":
        from fairsched.core import _matching_c as matching
    else:
        from fairsched.core import _matching_py as matching
    return matching.plan_optimal


# -- the simulation -----------------------------------------------------------------------------

@dataclass
class PolicyResult:
    policy: str
    starts: list[float]  # per job, in trace order
    slots: list[int]  # per job: the slot it ran on
    stranded: list[int]  # per job: cycles it waited although a better slot choice placed it
    cycles: int
    events: int
    wall_seconds: float
    makespan: float

    @property
    def events_per_second(self) -> float:
        return self.events / self.wall_seconds if self.wall_seconds > 0 else math.inf


def _take(heap: list, park: dict) -> tuple:
    """The best entry of a heap; the next job of its run, if one is parked, takes its place.

    An entry is its run's head (all but the last item) and a job id."""
    entry = heappop(heap)
    if park:
        head = entry[:-1]
        rest = park.get(head)
        if rest:
            heapq.heappush(heap, head + (rest.popleft(),))
            if not rest:
                del park[head]
    return entry


def _park(heap: list, park: dict, head: tuple) -> tuple:
    """Pop the run of key `head` at the top of `heap`; return its first entry and park the
    ids of the others behind it.

    Jobs of one key (one arrival, one priority: one score) rank by id, so once a cycle took
    as many of them as the type has free slots the others cannot be placed. A burst of jobs
    arriving at once waits as one heap entry this way, instead of being taken whole into
    every cycle within rounding of its key.
    """
    first = heappop(heap)
    ids = []
    while heap and heap[0][:-1] == head:
        ids.append(heappop(heap)[-1])
    if ids:
        rest = park.get(head)
        if rest:
            rest.extendleft(reversed(ids))
        else:
            park[head] = collections.deque(ids)
    return first


class Simulation:
    """One policy's replay of a trace on a fresh pool built from `slots`."""

    def __init__(self, trace: Trace, slots: Sequence[tuple[int, ...]], weights: core.Weights,
                 policy: str, tick: float = 0.0, matching: str = "greedy",
                 usage_half_life: float = 600.0):
        if policy not in _POLICY_CLASSES:
            raise ValueError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")
        if not (tick == 0 or MIN_TICK <= tick <= MAX_SECONDS):
            raise ValueError(f"tick must be 0 or a number of seconds from {MIN_TICK:g} to "
                             f"{MAX_SECONDS:g}, got {tick!r}")
        self.tick = tick
        self.matching = matching
        self.trace = trace
        self.at = trace.at
        self.types = trace.types
        self.priorities = trace.priorities
        self.on_demand = trace.on_demand
        self.tenants = trace.tenants or [0] * len(trace)
        self.n_tenants = len(trace.tenant_names)
        # Each tenant's usage (slot-seconds) as of when it was last added to, decayed by
        # usage_half_life, as the supervisors' fairsched_tenant_usage rows.
        self.half_life = usage_half_life
        self.usage = [0.0] * self.n_tenants
        self.usage_at = [0.0] * self.n_tenants
        self.weights = weights
        self.slot_types = [frozenset(ts) for ts in slots]
        self.slot_order = {sid: (len(ts), sid) for sid, ts in enumerate(slots)}
        self.n_types = max(len(trace.type_names), max((max(ts) for ts in slots), default=-1) + 1)
        self.pool = core.SlotPool()
        for sid, ts in enumerate(slots):
            self.pool.add_slot(sid, sid, ts)
        self.free_slots = set(range(len(slots)))
        self.policy = _POLICY_CLASSES[policy](self)

    def tenant_shares(self, now: float) -> array:
        """Each tenant's share of the usage at `now` (0 .. 1)."""
        usage = [u * 2.0 ** (-(now - t) / self.half_life) if u else 0.0
                 for u, t in zip(self.usage, self.usage_at, strict=True)]
        total = sum(usage)
        return array("d", [min(1.0, u / total) if total > 0 else 0.0 for u in usage])

    def _used(self, j: int, finish: float) -> None:
        """Job j ended at `finish`: its slot-seconds are its tenant's usage."""
        g = self.tenants[j]
        u = self.usage[g]
        if u:
            u *= 2.0 ** (-(finish - self.usage_at[g]) / self.half_life)
        self.usage[g] = u + self.trace.durations[j]
        self.usage_at[g] = finish

    def run(self) -> PolicyResult:
        trace, pool, policy = self.trace, self.pool, self.policy
        n = len(trace)
        at, types, durations = trace.at, trace.types, trace.durations
        key = policy.key
        split = policy.split_on_demand
        on_demand = trace.on_demand
        tenants = self.tenants
        by_tenant = policy.split_tenants and self.n_tenants > 1
        # heaps[t][0]: queued (or all) jobs of type t; heaps[t][1]: its on-demand jobs; with
        # tenants, heaps[t][1 + g]: tenant g's queued jobs (g > 0), as the supervisor's fetch
        # takes the best of each tenant.
        width = 1 + self.n_tenants if by_tenant else 2
        heaps = [tuple([] for _ in range(width)) for _ in range(self.n_types)]
        # Beside each heap: runs of jobs of one key parked behind the first (see _park).
        parked = [tuple({} for _ in range(width)) for _ in range(self.n_types)]

        def heap_of(j: int) -> int:
            if split and on_demand[j]:
                return 1
            g = tenants[j] if by_tenant else 0
            return g + 1 if g else 0

        take = _take
        waiting = [0] * self.n_types
        starts = [math.nan] * n
        ran_on = [-1] * n
        stranded = [0] * n
        running = []  # (finish, slot id)
        free_slots = self.free_slots
        release = pool.release
        heappush, heappop = heapq.heappush, heapq.heappop
        tick = self.tick
        near_ties = policy.near_ties
        cycles = 0
        last_finish = 0.0
        i = 0
        began = time.perf_counter()
        while i < n or running:
            now = at[i] if i < n else math.inf
            if running and running[0][0] < now:
                now = running[0][0]
            if tick:
                # Cycles only on the tick: whatever happened since the last one is seen at once.
                seen = math.ceil(now / tick) * tick
                now = seen if seen >= now else seen + tick
            while i < n and at[i] <= now:
                t = types[i]
                h = heap_of(i)
                entry = key(i)
                park = parked[t][h]
                if park and entry[:-1] in park:
                    park[entry[:-1]].append(i)  # the newest job: last of its run
                else:
                    heappush(heaps[t][h], entry)
                waiting[t] += 1
                i += 1
            while running and running[0][0] <= now:
                last_finish, sid, j = heappop(running)
                release(sid)
                free_slots.add(sid)
                if by_tenant and not on_demand[j]:
                    self._used(j, last_finish)
            if not pool.n_free:
                continue
            free = pool.free_counts(self.n_types)
            picked = []
            for t in range(self.n_types):
                k = free[t]
                if k and waiting[t]:
                    for h, (heap, park) in enumerate(zip(heaps[t], parked[t], strict=True)):
                        if not near_ties:
                            for _ in range(min(k, len(heap))):
                                picked.append(heappop(heap))
                            continue
                        first = len(picked)
                        for _ in range(k):
                            if not heap:
                                break
                            picked.append(take(heap, park))
                        if not heap or len(picked) == first:
                            continue
                        # Keys within rounding of the last one taken may be exact ties
                        # of score: the core's tie-break (older first) settles those.
                        last = picked[-1][0]
                        limit = policy.near_tie(h == 1, now)
                        if heap[0][0] - last > limit:
                            continue
                        taken = collections.Counter(e[:-1] for e in picked[first:])
                        aside = []
                        while heap and heap[0][0] - last <= limit:
                            head = heap[0][:-1]
                            if taken[head] >= k:
                                aside.append(_park(heap, park, head))
                                continue
                            taken[head] += 1
                            picked.append(take(heap, park))
                        for entry in aside:
                            heappush(heap, entry)
            if not picked:
                continue
            cycles += 1
            placed, unplaced = policy.plan(picked, now, free)
            for j, sid in placed:
                starts[j] = now
                ran_on[j] = sid
                waiting[types[j]] -= 1
                free_slots.discard(sid)
                heappush(running, (now + durations[j], sid, j))
            if unplaced:
                for j in unplaced:
                    heappush(heaps[types[j]][heap_of(j)], key(j))
                if free_slots:
                    self.count_stranded(placed, unplaced, stranded)
        wall = time.perf_counter() - began
        return PolicyResult(policy=policy.name, starts=starts, slots=ran_on, stranded=stranded,
                            cycles=cycles,
                            events=2 * n, wall_seconds=wall, makespan=last_finish - at[0])

    def count_stranded(self, placed, unplaced, stranded) -> None:
        """Charge a stranded cycle to each waiting job a better slot choice would have placed.

        Over this cycle's candidates and the slots free at its start, the jobs the policy
        placed are kept and more are added, in the policy's rank order, wherever an
        augmenting path exists (placed jobs moving to other free slots of their type until
        one lands on a slot left free): exactly the jobs that waited only because of which
        slots the placed jobs took.
        """
        types = self.types
        taken_types = set()
        for _, sid in placed:
            taken_types |= self.slot_types[sid]
        if not any(types[j] in taken_types for j in unplaced):
            return  # every slot a waiting job could use was already free or busy before
        nodes = [sid for _, sid in placed] + sorted(self.free_slots)
        nodes.sort(key=self.slot_order.__getitem__)
        slot_types = self.slot_types

        class Adjacency(dict):
            def __missing__(adj, t):
                adj[t] = found = [s for s in nodes if t in slot_types[s]]
                return found

        adj = Adjacency()
        occ = {sid: types[j] for j, sid in placed}
        room = len(self.free_slots)
        dead = set()
        for j in unplaced:
            t = types[j]
            if t in dead:
                continue
            if augment(t, adj, occ):
                stranded[j] += 1
                room -= 1
                if not room:
                    return
            else:
                dead.add(t)


def simulate(trace: Trace, slots: Sequence[tuple[int, ...]], weights: core.Weights,
             policy: str, tick: float = 0.0, matching: str = "greedy",
             usage_half_life: float = 600.0) -> PolicyResult:
    """Replay `trace` under `policy`; with `tick` > 0, cycles run only every `tick` seconds;
    `matching` is the `fairsched` policy's (the config's [scoring] matching)."""
    return Simulation(trace, slots, weights, policy, tick, matching, usage_half_life).run()


def tenant_alone(trace: Trace, slots: Sequence[tuple[int, ...]]) -> list[float]:
    """Each tenant's mean response (wait + run) with the slots to itself, first in first out:
    the yardstick of the fairness index (report.jain_index)."""
    out = []
    for g in range(len(trace.tenant_names)):
        js = [j for j in range(len(trace)) if trace.tenants[j] == g]
        if not js:
            out.append(math.nan)
            continue
        alone = Trace(trace.path, trace.type_names, [trace.at[j] for j in js],
                      [trace.types[j] for j in js], [trace.priorities[j] for j in js],
                      [trace.on_demand[j] for j in js], [trace.durations[j] for j in js],
                      [trace.line[j] for j in js], [0] * len(js), [""])
        r = Simulation(alone, slots, core.Weights(), "fifo").run()
        out.append(sum(r.starts[k] - alone.at[k] + alone.durations[k] for k in range(len(js)))
                   / len(js))
    return out
