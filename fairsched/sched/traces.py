"""Job traces for `fairsched simulate`: the file format and generators for the classic scenarios.

A trace is JSON lines, one job per line, in any order of arrival:

    {"at": 12.5, "type": "pdf", "priority": 0, "on_demand": false, "duration": 30.0}

`at` (arrival, seconds from the start), `type` and `duration` (seconds of work) are required;
`priority` (0..10) defaults to 0 and `on_demand` to false. Each generator returns a Scenario:
the jobs and the worker layout they were designed for, written as a workers.toml.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Job:
    at: float
    type: str
    priority: int = 0
    on_demand: bool = False
    duration: float = 1.0

    def line(self) -> str:
        return (f'{{"at": {self.at!r}, "type": {json.dumps(self.type)}, "priority": {self.priority}, '
                f'"on_demand": {"true" if self.on_demand else "false"}, '
                f'"duration": {self.duration!r}}}')


@dataclass(frozen=True)
class Group:
    """One [[worker]] table: `processes` processes of `slots` slots, each handling `types`."""

    name: str
    types: tuple[str, ...]
    processes: int = 1
    slots: int = 1


@dataclass
class Scenario:
    name: str
    description: str
    workers: list[Group]
    jobs: list[Job] = field(default_factory=list)

    def workers_toml(self) -> str:
        return workers_toml(self.workers, f"{self.name}: {self.description}")

    def write(self, directory: Path) -> tuple[Path, Path]:
        """Write NAME.jsonl and NAME.workers.toml into `directory`; return both paths."""
        directory.mkdir(parents=True, exist_ok=True)
        trace = directory / f"{self.name}.jsonl"
        workers = directory / f"{self.name}.workers.toml"
        write_trace(trace, self.jobs)
        workers.write_text(self.workers_toml(), encoding="utf-8")
        return trace, workers


def write_trace(path: Path, jobs: Iterable[Job]) -> int:
    """Write jobs as JSON lines; return how many were written."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for job in jobs:
            f.write(job.line())
            f.write("\n")
            n += 1
    return n


def workers_toml(groups: list[Group], comment: str = "") -> str:
    """A workers.toml for `fairsched simulate`; the handlers are never imported there."""
    lines = [f"# {comment}" if comment else "# workers for a simulated trace",
             "# `fairsched simulate` only reads the slots and [scoring]; handlers are not run.",
             ""]
    for g in groups:
        types = ", ".join(f'"{t}"' for t in g.types)
        lines += ["[[worker]]", f'name = "{g.name}"', f"types = [{types}]",
                  'handler = "simulated:job"', f"processes = {g.processes}",
                  f"slots = {g.slots}", ""]
    return "\n".join(lines)


def _lognormal(rng: random.Random, mean: float, sigma: float = 0.6) -> float:
    return round(rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma), 3)


# -- the starvation scenario ----------------------------------------------------------------------

def starvation(flood_seconds: float = 3600.0, duration: float = 10.0,
               rare_at: float = 65.0, flood_priority: int = 5) -> Scenario:
    """A rare type with one slot under a flood of higher-priority work, plus one rare job.

    Three `pdf` slots and one `office` slot that also runs `index`. Every `duration` seconds,
    exactly as many priority-5 pdf jobs arrive as there are slots, so the pool never has a
    spare slot for the single priority-0 `index` job arriving at `rare_at`. Strict priority
    starves it until the flood ends; aging lets it through after about 5 x W_p / W_a seconds.
    """
    workers = [Group("pdf", ("pdf",), processes=3), Group("office", ("pdf", "index"))]
    per_burst = sum(g.processes * g.slots for g in workers)
    jobs = []
    t = 0.0
    while t < flood_seconds:
        jobs += [Job(t, "pdf", flood_priority, False, duration)] * per_burst
        t = round(t + duration, 6)
    jobs.append(Job(rare_at, "index", 0, False, duration))
    jobs.sort(key=lambda j: j.at)
    return Scenario("starvation", f"one rare index job under a {flood_seconds:g} s flood of "
                    f"priority-{flood_priority} pdf work", workers, jobs)


# -- a mixed office day ---------------------------------------------------------------------------

# Two versatile groups whose types overlap without nesting: a pdf job finding both free takes
# the `office` slot (as specialised, lower id), which an excel job may have needed.
OFFICE_WORKERS = [
    Group("pdf", ("pdf",), processes=2),
    Group("excel", ("excel",)),
    Group("office", ("pdf", "excel"), slots=2),
    Group("search", ("pdf", "index")),
]
# (type, share of the jobs, mean duration in seconds)
OFFICE_MIX = [("pdf", 0.55, 20.0), ("excel", 0.40, 8.0), ("index", 0.05, 60.0)]
# Hourly load, as a fraction of the pool's capacity: a morning peak above capacity, a lunch dip.
OFFICE_PROFILE = [0.4, 0.9, 1.15, 1.0, 0.5, 0.8, 1.1, 0.9, 0.5]
PRIORITY_MIX = [(0, 0.70), (3, 0.20), (6, 0.08), (9, 0.02)]


def _capacity(workers: list[Group]) -> int:
    return sum(g.processes * g.slots for g in workers)


def _mean_service(mix) -> float:
    return sum(share * mean for _, share, mean in mix)


def _choose(rng: random.Random, options):
    """One of `options` (tuples whose second item is a share), drawn by share."""
    r = rng.random()
    for option in options:
        r -= option[1]
        if r < 0:
            return option
    return options[-1]


def _draw_job(rng: random.Random, at: float, on_demand_share: float) -> Job:
    type_name, _, mean = _choose(rng, OFFICE_MIX)
    on_demand = rng.random() < on_demand_share
    priority = 0 if on_demand else _choose(rng, PRIORITY_MIX)[0]
    return Job(round(at, 3), type_name, priority, on_demand, _lognormal(rng, mean))


def office_day(hours: int = 9, seed: int = 1, on_demand_share: float = 0.08) -> Scenario:
    """A working day of PDF and Excel jobs with a few index jobs and some on-demand requests.

    Arrivals are Poisson with an hourly rate following OFFICE_PROFILE (the morning peak goes
    above capacity, so queues build and drain); priorities and durations are random.
    """
    rng = random.Random(seed)
    rate_at_capacity = _capacity(OFFICE_WORKERS) / _mean_service(OFFICE_MIX)
    jobs = []
    t = 0.0
    for hour in range(hours):
        load = OFFICE_PROFILE[hour % len(OFFICE_PROFILE)]
        rate = load * rate_at_capacity
        end = (hour + 1) * 3600.0
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                t = end
                break
            jobs.append(_draw_job(rng, t, on_demand_share))
    return Scenario("office_day", f"{hours} h of pdf and excel work with a morning peak",
                    list(OFFICE_WORKERS), jobs)


# -- a burst of on-demand requests ----------------------------------------------------------------

def on_demand_burst(seconds: float = 1800.0, burst_at: float = 600.0, burst_seconds: float = 60.0,
                    burst_jobs: int = 120, background_load: float = 0.8,
                    seed: int = 2) -> Scenario:
    """Steady queued work at `background_load`, then `burst_jobs` on-demand requests at once.

    The burst alone is several minutes of work for the whole pool: on-demand jobs go first,
    and queued jobs waiting through it get their turn once they have aged B_od / W_a seconds.
    """
    rng = random.Random(seed)
    rate = background_load * _capacity(OFFICE_WORKERS) / _mean_service(OFFICE_MIX)
    jobs = []
    t = rng.expovariate(rate)
    while t < seconds:
        jobs.append(_draw_job(rng, t, 0.0))
        t += rng.expovariate(rate)
    for _ in range(burst_jobs):
        at = burst_at + rng.random() * burst_seconds
        type_name = "pdf" if rng.random() < 0.6 else "excel"
        mean = 20.0 if type_name == "pdf" else 8.0
        jobs.append(Job(round(at, 3), type_name, 0, True, _lognormal(rng, mean)))
    jobs.sort(key=lambda j: j.at)
    return Scenario("on_demand_burst", f"{burst_jobs} on-demand requests in {burst_seconds:g} s "
                    f"over queued work at {background_load:g} of capacity",
                    list(OFFICE_WORKERS), jobs)


# -- a long random load, for benchmarks -----------------------------------------------------------

def random_load(n_jobs: int, load: float = 0.95, seed: int = 3,
                on_demand_share: float = 0.05) -> Scenario:
    """`n_jobs` Poisson arrivals of the office mix at `load` x the office pool's capacity."""
    rng = random.Random(seed)
    rate = load * _capacity(OFFICE_WORKERS) / _mean_service(OFFICE_MIX)
    jobs = []
    t = 0.0
    for _ in range(n_jobs):
        t += rng.expovariate(rate)
        jobs.append(_draw_job(rng, t, on_demand_share))
    return Scenario("random_load", f"{n_jobs} jobs at {load:g} of capacity",
                    list(OFFICE_WORKERS), jobs)


SCENARIOS = {
    "starvation": starvation,
    "office_day": office_day,
    "on_demand_burst": on_demand_burst,
}
