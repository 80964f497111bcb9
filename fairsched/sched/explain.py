"""What the `[scoring]` weights mean in time, and why a pending job has the score it has.

score = priority x W_p + age x W_a + W_r / free compatible slots + (on-demand: B_od + age x W_od)

Aging is what turns weights into times: a gap of g priority levels is bridged after
g x W_p / W_a seconds, and a fresh on-demand job stays ahead of a queued priority-0 job for
B_od / W_a seconds. The totals here come from the core's own scoring, not from a copy of it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from fairsched import core
from fairsched.config import Config
from fairsched.errors import FairschedError, path_name

PRIORITY_GAPS = range(1, 11)
FREE_SLOT_COUNTS = range(1, 9)


class JobNotPending(FairschedError):
    """The job exists but is not waiting, so it has no score."""


def priority_crossovers(weights: core.Weights, gaps=PRIORITY_GAPS) -> list[tuple[int, float]]:
    """(gap, seconds): how long a job waits before it outranks a fresh job `gap` levels higher."""
    return [(gap, _divide(gap * weights.priority, weights.age)) for gap in gaps]


def on_demand_crossover(weights: core.Weights) -> float:
    """Seconds a queued priority-0 job waits before it outranks a fresh on-demand job.

    The fresh on-demand job has B_od (its age term is still zero); the queued job gains W_a
    per second. Rarity is left out: it is the same for two jobs of one type.
    """
    return _divide(weights.on_demand, weights.age)


def rarity_bonuses(weights: core.Weights, counts=FREE_SLOT_COUNTS) -> list[tuple[int, float]]:
    """(free compatible slots, points): the hyperbolic rarity bonus W_r / n."""
    return [(n, weights.rarity / n) for n in counts]


def _divide(points: float, rate: float) -> float:
    if points == 0:
        return 0.0
    return points / rate if rate > 0 else math.inf


@dataclass(frozen=True)
class Breakdown:
    """One job's score split by component, in points, with the inputs that produced it."""

    priority: int
    age: float  # seconds since the job became eligible
    free_slots: int  # free compatible slots counted for the rarity bonus
    on_demand: bool
    priority_points: float
    age_points: float
    rarity_points: float
    on_demand_points: float
    total: float  # the core's score_candidates for the same job
    tenant: str | None = None  # the job's tenant (None: the default tenant)
    tenant_share: float = 0.0  # its share of the recent usage, above the lowest share
    tenant_points: float = 0.0  # -tenant_weight x tenant_share

    def as_dict(self) -> dict:
        return asdict(self)


def score_breakdown(weights: core.Weights, *, priority: int, age: float, free_slots: int,
                    on_demand: bool = False, tenant: str | None = None, share: float = 0.0,
                    lowest_share: float = 0.0) -> Breakdown:
    """Split a job's score into the components of the formula; a queued job's tenant term
    from its tenant's usage `share` and the lowest share among the tenants waiting.

    The total is what core.score_candidates gives the same job, so this breakdown and the
    supervisor cannot drift apart.
    """
    age = max(0.0, float(age))
    free_slots = max(0, int(free_slots))
    rarity = weights.rarity / free_slots if free_slots > 0 else 0.0
    bonus = weights.on_demand + age * weights.on_demand_age if on_demand else 0.0
    # Type id 0 with `free_slots` free slots; eligible `age` seconds before now. Now is 0, so
    # the age reaches the core exactly as given: the total equals the sum of its parts.
    now = 0.0
    # The lightest tenant waiting is a second candidate (of a type with no slot), so that the
    # core measures the tenant term from its share as the supervisor's cycle does.
    cands = core.Candidates.from_lists(
        [0, 1], [priority, 0], [-age, 0.0], [on_demand, False], [0, 1],
        tenants=[-1 if on_demand else 0, 1], tenant_shares=[share, min(share, lowest_share)])
    scores, _ = core.score_candidates(cands, now, [free_slots], weights)
    above = 0.0 if on_demand else share - min(share, lowest_share)
    return Breakdown(
        priority=priority, age=age, free_slots=free_slots, on_demand=bool(on_demand),
        priority_points=priority * weights.priority, age_points=age * weights.age,
        rarity_points=rarity, on_demand_points=bonus, total=scores[0], tenant=tenant,
        tenant_share=above, tenant_points=-(weights.tenant * above) if above else 0.0)


# -- text ---------------------------------------------------------------------------------------

def _number(value: float) -> str:
    """Up to three decimals, without trailing zeros; very large or small ones as 1.5e+12."""
    if value == 0:
        return "0"
    if 1e-3 <= abs(value) < 1e9:
        return f"{value:.3f}".rstrip("0").rstrip(".")
    return f"{value:.3g}"


def _seconds(value: float) -> str:
    if math.isinf(value):
        return "never (age_weight is 0, or too small to count)"
    text = f"{_number(value)} s"
    if 120 <= value < 1e9:
        text += f" ({value / 60:.1f} min)"
    return text


def _points(value: float) -> str:
    return _number(value)


def _cell(value: float) -> str:
    """Points in the job table: one decimal (3072.0, 62.5) where that is exact; otherwise up
    to three, or three significant digits, so that a small weight's points do not read 0.0
    and a huge one's stay in the column."""
    if value == 0 or (abs(value) < 1e9 and round(value, 1) == value):
        return f"{value:.1f}"
    return _number(value)


def weights_report(weights: core.Weights, source: str) -> str:
    """The weights in effect and their meaning in time, as a human-readable text."""
    w = weights
    lines = [
        f"weights in effect ({source}):",
        f"  priority_weight       W_p  = {_points(w.priority):>8}  points per priority level",
        f"  age_weight            W_a  = {_points(w.age):>8}  points per second waited",
        f"  rarity_weight         W_r  = {_points(w.rarity):>8}  points / free compatible slots",
        f"  on_demand_bonus       B_od = {_points(w.on_demand):>8}  points for an on-demand job",
        f"  on_demand_age_weight  W_od = {_points(w.on_demand_age):>8}  extra points/s for an "
        "on-demand job",
        f"  tenant_weight         W_t  = {_points(w.tenant):>8}  points off per usage share",
        "",
        "priority crossover: a job overtakes a fresh job GAP levels higher after",
        "  GAP x W_p / W_a seconds",
        "  GAP  WAIT",
    ]
    lines += [f"  {gap:>3}  {_seconds(s)}" for gap, s in priority_crossovers(w)]
    lines += [
        "",
        "on-demand vs queued: a fresh on-demand job outranks a queued priority-0 job",
        f"  until that job has waited B_od / W_a = {_seconds(on_demand_crossover(w))}; a waiting",
        f"  on-demand job gains {_points(w.age + w.on_demand_age)} points/s instead of "
        f"{_points(w.age)}",
        "  a fresh on-demand job of priority p outranks fresh queued jobs below priority",
        f"  p + B_od / W_p = p + {_number(_divide(w.on_demand, w.priority))}"
        + (" (W_p is 0: all of them)" if w.priority == 0 and w.on_demand > 0
           else " (B_od and W_p are 0: none, when just as old)" if w.priority == 0 else ""),
        "",
        "tenants: a fresh job of the tenant that used the slots least outranks the",
        "  older jobs of one that used them all (same priority) until those have waited",
        f"  W_t / W_a = {_seconds(_divide(w.tenant, w.age))}",
        "",
        "rarity bonus W_r / n for a job type with n free compatible slots",
        "  FREE    POINTS  WORTH",
    ]
    for n, points in rarity_bonuses(w):
        worth = f"{_seconds(_divide(points, w.age))} of waiting" if w.age > 0 else ""
        lines.append(f"  {n:>4}  {_points(points):>8}  {worth}")
    return "\n".join(lines)


# -- one job ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class JobExplanation:
    job_id: int
    type: str
    status: str
    eligible_in: float  # seconds until the job becomes eligible; 0 when it already is
    breakdown: Breakdown
    free_source: str  # where the free slot count came from

    def as_dict(self) -> dict:
        out = asdict(self)
        out["breakdown"] = self.breakdown.as_dict()
        return out


def configured_slots(config: Config, type_name: str) -> int:
    """Slots in workers.toml that can run `type_name` (processes x slots of each worker)."""
    return sum(w.processes * w.slots for w in config.workers if type_name in w.types)


def free_slots(config: Config, type_name: str, timeout: float = 2.0) -> tuple[int, str]:
    """(free compatible slots, where the number comes from).

    A running supervisor answers with its live free slots; without one, every configured
    compatible slot counts as free, and the source says so.
    """
    from fairsched.control_client import ControlClient

    try:
        ps = ControlClient(config.control_socket, timeout, starting_within=timeout).ps()
    except (FairschedError, OSError, ValueError, KeyError):
        n = configured_slots(config, type_name)
        return n, (f"no supervisor reachable on {config.control_socket}: counting all {n} "
                   f"configured slots that handle {type_name!r} as free")
    n = sum(1 for row in ps["slots"] if row.get("state") == "free" and type_name in row["types"])
    return n, f"{n} that handle {type_name!r}, counted in the running supervisor"


# Each tenant with a pending job of the type, and its usage decayed to now (0 without a row).
TENANT_USAGE_SQL = """
SELECT w.tenant, coalesce(u.usage * power(2::float8, greatest(
           -extract(epoch FROM now() - u.updated_at)::float8 / %(half_life)s::float8,
           -1000::float8)), 0)
  FROM (SELECT DISTINCT coalesce(tenant, '') AS tenant FROM fairsched_jobs
         WHERE status = 'pending' AND type = %(type)s) AS w
  LEFT JOIN fairsched_tenant_usage AS u ON u.tenant = w.tenant
"""


def explain_job(config: Config | None, job_id: int) -> JobExplanation:
    """The current score of pending job `job_id`, read from the job table, by component.
    With no `config` (a host that only queues work), the database is FAIRSCHED_DATABASE_URL's
    and the weights are the defaults.

    Raises JobNotFound for an unknown id and JobNotPending for a job that is not waiting.
    """
    from fairsched.store.errors import JobNotFound
    from fairsched.store.queue import Queue

    if config is None:
        opened = Queue.open(Path.cwd(), None, create=True)
    else:
        opened = Queue.open(config.supervisor.state_dir, config.supervisor.database,
                            create=True, config_file=config.path)
    half_life = config.usage_half_life if config is not None else 600.0
    with opened as queue:
        job = queue.get_job(job_id)
        # The database clock, so the age does not depend on this host's clock.
        (now,) = queue.conn.execute("SELECT extract(epoch FROM now())::float8").fetchone()
        usage = dict(queue.conn.execute(TENANT_USAGE_SQL, {
            "type": job["type"] if job else "", "half_life": half_life}).fetchall())
    if job is None:
        raise JobNotFound(job_id)
    if job["status"] != "pending":
        state = "has succeeded" if job["status"] == "succeeded" else f"is {job['status']}"
        raise JobNotPending(f"job {job_id} {state}: only a pending job has a score")
    eligible_at = job["run_after"].timestamp()
    if config is None:
        n_free, source = 0, "not counted (no ./workers.toml here; the default weights)"
    else:
        n_free, source = free_slots(config, job["type"])
        if not configured_slots(config, job["type"]):
            source = (f"no worker in {path_name(config.path)} handles {job['type']!r}: it "
                      "cannot run here")
    weights = config.scoring if config is not None else core.Weights()
    # The shares as a supervisor fetching this type would make them: each waiting tenant's
    # usage over theirs all, the term measured from the lowest.
    total = sum(usage.values())
    shares = {t: min(1.0, u / total) if total > 0 else 0.0 for t, u in usage.items()}
    share = shares.get(job.get("tenant") or "", 0.0)
    breakdown = score_breakdown(weights, priority=job["priority"],
                                age=now - eligible_at, free_slots=n_free,
                                tenant=job.get("tenant"), share=share,
                                lowest_share=min(shares.values(), default=share))
    return JobExplanation(job_id=job_id, type=job["type"], status=job["status"],
                          eligible_in=max(0.0, eligible_at - now), breakdown=breakdown,
                          free_source=source)


def _delay(seconds: float) -> str:
    """Time until a delayed job is eligible: whole seconds, tenths under 10 s, and never 0 (it
    is not eligible yet)."""
    if round(seconds, 1) >= 10:
        return f"{seconds:.0f} s"
    return f"{seconds:.1f} s" if seconds >= 0.05 else "less than 0.1 s"


def job_report(ex: JobExplanation, weights: core.Weights) -> str:
    """An sprio-like table: each component's points and where they come from."""
    b = ex.breakdown
    when = (f"eligible in {_delay(ex.eligible_in)}" if ex.eligible_in > 0
            else f"waiting {b.age:.1f} s")
    from fairsched.cli.common import printable  # a type from the table may hold anything

    rarity_from = (f"{_points(weights.rarity)} / {b.free_slots} free compatible slots"
                   if b.free_slots else "no free compatible slot")
    rows = [
        ("priority", b.priority_points, f"{b.priority} x {_points(weights.priority)}"),
        ("age", b.age_points, f"{b.age:.1f} s x {_points(weights.age)}"),
        ("rarity", b.rarity_points, rarity_from),
        ("on-demand", b.on_demand_points, "queued job"),
        ("tenant", b.tenant_points,
         f"-{_points(weights.tenant)} x {b.tenant_share:.3f} (usage share over the lowest)"),
    ]
    lines = [f"job {ex.job_id}: type {printable(ex.type)}, priority {b.priority}, {ex.status}, "
             f"{when}"]
    if ex.eligible_in > 0:
        lines.append("  no candidate until then: the score below is the one it starts with")
    lines.append("  COMPONENT      POINTS  FROM")
    lines += [f"  {name:<10} {_cell(points):>10}  {source}" for name, points, source in rows]
    lines.append(f"  {'total':<10} {_cell(b.total):>10}")
    tenant = "the default one" if b.tenant is None else printable(b.tenant)[:60]
    lines.append(f"  tenant: {tenant}")
    lines.append(f"  free slots: {ex.free_source}")
    return "\n".join(lines)
