"""Job traces for `fairsched simulate`: the file format, its reader, and generators for the
classic scenarios.

A trace is JSON lines, one job per line, in any order of arrival:

    {"at": 12.5, "type": "pdf", "priority": 0, "on_demand": false, "duration": 30.0}

`at` (arrival, seconds from the start), `type` and `duration` (seconds of work) are required;
`priority` (0..10) defaults to 0, `on_demand` to false and `tenant` (who the job is for, by
the tenant name rule) to the default tenant. Each generator returns a Scenario:
the jobs and the worker layout they were designed for, written as a workers.toml.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fairsched.errors import LongInteger, path_name, read_int
from fairsched.logs import quoted
from fairsched.sched import TraceError
from fairsched.store.schema import MAX_PRIORITY
from fairsched.type_names import tenant_name_problem

TRACE_KEYS = frozenset({"at", "type", "priority", "on_demand", "duration", "tenant"})
MAX_SECONDS = 1e9  # about 32 years: a trace's times and durations, and sums of them, stay exact
MIN_TICK = 0.001
QUOTE_MAX = 100  # characters of a trace's own words (a type name, a key) an error quotes


# -- reading a trace ----------------------------------------------------------------------------

@dataclass
class Trace:
    """Jobs in arrival order (ties keep file order), column-wise; `line` is each job's line."""

    path: str
    type_names: list[str]  # by type id
    at: list[float] = field(default_factory=list)
    types: list[int] = field(default_factory=list)
    priorities: list[int] = field(default_factory=list)
    on_demand: list[bool] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    line: list[int] = field(default_factory=list)
    # Each job's tenant id, indexing tenant_names ("" is the default tenant, always id 0).
    tenants: list[int] = field(default_factory=list)
    tenant_names: list[str] = field(default_factory=lambda: [""])

    def __len__(self) -> int:
        return len(self.at)


def _number(value, key: str, where: str, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TraceError(f"{where}: '{key}' must be a number of seconds, got {_json_kind(value)}")
    try:
        value = float(value)
    except OverflowError:  # an integer past any float
        value = math.inf
    if not math.isfinite(value) or not minimum <= value <= MAX_SECONDS:
        raise TraceError(f"{where}: '{key}' must be a number of seconds from {minimum:g} to "
                         f"{MAX_SECONDS:g}, got {value!r}")
    return value


def _json_kind(value) -> str:
    """A value as JSON names it, for messages: null, true, an array, ..."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    kind = {dict: "an object", list: "an array", str: "a string"}.get(type(value))
    return kind or _json(value)


def _json(value) -> str:
    """A value of the trace's as JSON writes it, for messages: cut short, as a line may hold a
    50 KB string or 4000 digits."""
    return _cut(value, json.dumps)


def _name(text: str) -> str:
    """A key or a type of the trace's, as a message quotes it: on one line and cut short."""
    return _cut(text, repr)


def _cut(value, spell) -> str:
    if isinstance(value, str) and len(value) > QUOTE_MAX:  # counted as written, not spelled
        return f"{spell(value[:QUOTE_MAX])}... ({len(value)} characters in all)"
    return quoted(spell(value), QUOTE_MAX)


def read_trace(path: str | Path, type_ids: Mapping[str, int]) -> Trace:
    """Load a JSON-lines trace ("-": standard input, named `stdin`); any bad line raises
    TraceError naming the file and the line."""
    names = sorted(type_ids, key=type_ids.__getitem__)
    rows = []
    if str(path) == "-":
        if sys.stdin is None:
            raise TraceError("stdin: cannot read: standard input is closed")
        path, f = "stdin", contextlib.nullcontext(sys.stdin.buffer)  # left open: not ours
    else:
        path = Path(path)
        try:
            f = open(path, "rb")
        except OSError as exc:
            raise TraceError(f"{path_name(path)}: cannot read: {exc.strerror or exc}") from None
    name = path_name(path)
    with f as f:
        try:
            for number, raw in enumerate(f, 1):
                try:
                    # A byte order mark, as some editors write, only opens a file.
                    text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
                except UnicodeDecodeError as exc:
                    raise TraceError(f"{name} line {number}: not UTF-8 text ({exc.reason} at "
                                     f"byte {exc.start + 1})") from None
                if text.strip():
                    rows.append(_parse_line(text, f"{name} line {number}", type_ids) + (number,))
        except OSError as exc:  # a folder, a file gone unreadable
            raise TraceError(f"{name}: cannot read: {exc.strerror or exc}") from None
    if not rows:
        raise TraceError(f"{name}: no jobs in the trace")
    rows.sort(key=lambda row: row[0])  # stable: ties keep file order
    trace = Trace(str(path), names)
    (trace.at, trace.types, trace.priorities, trace.on_demand, trace.durations, tenants,
     trace.line) = (list(column) for column in zip(*rows, strict=True))
    ids = {"": 0}
    trace.tenants = [ids.setdefault(t, len(ids)) for t in tenants]
    trace.tenant_names = list(ids)
    return trace


def _parse_line(text: str, where: str, type_ids: Mapping[str, int]) -> tuple:
    try:
        job = json.loads(text, parse_int=read_int)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    except LongInteger as exc:  # an integer of more digits than Python converts
        raise TraceError(f"{where}: {exc}") from None
    except RecursionError:
        raise TraceError(f"{where}: nests too deeply to be a job") from None
    if not isinstance(job, dict):
        raise TraceError(f"{where}: must be a JSON object, got {_json_kind(job)}")
    # Each key and string value is two quotes: more quotes than that is a key given twice
    # (json keeps the last, silently) or an escaped quote in a string, told apart here.
    if text.count('"') > 2 * (len(job) + sum(isinstance(v, str) for v in job.values())):
        json.loads(text, object_pairs_hook=lambda pairs: _no_repeated_key(pairs, where))
    unknown = sorted(set(job) - TRACE_KEYS)
    if unknown:
        raise TraceError(f"{where}: unknown key {_name(unknown[0])} "
                         f"(known: {', '.join(sorted(TRACE_KEYS))})")
    for key in ("at", "type", "duration"):
        if key not in job:
            raise TraceError(f"{where}: '{key}' is missing")
    at = _number(job["at"], "at", where)
    duration = _number(job["duration"], "duration", where)
    type_name = job["type"]
    if not isinstance(type_name, str) or not type_name:
        raise TraceError(f"{where}: 'type' must be a non-empty string, got {_json(type_name)}")
    type_id = type_ids.get(type_name)
    if type_id is None:
        known = ", ".join(sorted(type_ids))
        raise TraceError(f"{where}: no worker handles type {_name(type_name)} (configured: {known})")
    priority = job.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) \
            or not 0 <= priority <= MAX_PRIORITY:
        raise TraceError(f"{where}: 'priority' must be an integer from 0 to {MAX_PRIORITY}, "
                         f"got {_json(priority)}")
    on_demand = job.get("on_demand", False)
    if not isinstance(on_demand, bool):
        raise TraceError(f"{where}: 'on_demand' must be true or false, got {_json(on_demand)}")
    tenant = job.get("tenant")
    if tenant is not None and tenant_name_problem(tenant) is not None:
        raise TraceError(f"{where}: 'tenant' is an {tenant_name_problem(tenant)}")
    return at, type_id, priority, on_demand, duration, tenant or ""


def _no_repeated_key(pairs: list[tuple], where: str) -> dict:
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise TraceError(f"{where}: key {_name(key)} is given twice")
        seen.add(key)
    return dict(pairs)


# -- the generators ----------------------------------------------------------------------------

@dataclass(frozen=True)
class TraceJob:
    """One line of a trace: a job arriving `at` seconds in, that runs `duration` seconds."""

    at: float
    type: str
    priority: int = 0
    on_demand: bool = False
    duration: float = 1.0
    tenant: str | None = None

    def line(self) -> str:
        tenant = "" if self.tenant is None else f', "tenant": {json.dumps(self.tenant)}'
        return (f'{{"at": {self.at!r}, "type": {json.dumps(self.type)}, "priority": {self.priority}, '
                f'"on_demand": {"true" if self.on_demand else "false"}, '
                f'"duration": {self.duration!r}{tenant}}}')


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
    jobs: list[TraceJob] = field(default_factory=list)

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


def write_trace(path: Path, jobs: Iterable[TraceJob]) -> int:
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
        jobs += [TraceJob(t, "pdf", flood_priority, False, duration)] * per_burst
        t = round(t + duration, 6)
    jobs.append(TraceJob(rare_at, "index", 0, False, duration))
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


def _draw_job(rng: random.Random, at: float, on_demand_share: float) -> TraceJob:
    type_name, _, mean = _choose(rng, OFFICE_MIX)
    on_demand = rng.random() < on_demand_share
    priority = 0 if on_demand else _choose(rng, PRIORITY_MIX)[0]
    return TraceJob(round(at, 3), type_name, priority, on_demand, _lognormal(rng, mean))


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
        jobs.append(TraceJob(round(at, 3), type_name, 0, True, _lognormal(rng, mean)))
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


def noisy_neighbour(seconds: float = 1800.0, flood_at: float = 300.0, flood_jobs: int = 3000,
                    tenants: int = 20, seed: int = 5) -> Scenario:
    """One tenant floods, many submit a few: `flood_jobs` pdf jobs from tenant `flood` at
    `flood_at` (ten minutes of work for the four slots), while `tenants` other tenants each
    submit a pdf job every minute or so all along. First in, first out, every job arriving
    after the flood waits for all of it; fair shares keep the others' waits about one job."""
    rng = random.Random(seed)
    workers = [Group("pdf", ("pdf",), processes=2, slots=2)]
    jobs = [TraceJob(flood_at, "pdf", 0, False, round(_lognormal(rng, 0.8), 3), "flood")
            for _ in range(flood_jobs)]
    for k in range(tenants):
        t = rng.uniform(0.0, 60.0)
        while t < seconds:
            jobs.append(TraceJob(round(t, 3), "pdf", 0, False, round(_lognormal(rng, 0.8), 3),
                                 f"t{k:02d}"))
            t += rng.expovariate(1 / 60.0)
    jobs.sort(key=lambda j: j.at)
    return Scenario("noisy_neighbour", f"tenant flood enqueues {flood_jobs} pdf jobs at "
                    f"{flood_at:g} s; {tenants} other tenants submit one a minute each",
                    workers, jobs)


SCENARIOS = {
    "starvation": starvation,
    "office_day": office_day,
    "on_demand_burst": on_demand_burst,
    "noisy_neighbour": noisy_neighbour,
}
