"""The report of a simulation: per (type, priority, on-demand) group, the waits (p50, p99,
max) and the times a job was stranded, for several policies side by side, as a table or JSON.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fairsched.errors import path_name
from fairsched.sched.simulate import PolicyResult
from fairsched.sched.traces import Trace


def percentile(ordered: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an ascending sequence."""
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class GroupStats:
    type: str
    priority: int
    on_demand: bool
    count: int
    wait_p50: float
    wait_p99: float
    wait_max: float
    stranded: int


def group_stats(trace: Trace, result: PolicyResult) -> list[GroupStats]:
    """Waits and stranded counts per (type, priority, on-demand), sorted by those keys."""
    waits: dict[tuple, list[float]] = {}
    stranded: dict[tuple, int] = {}
    for j in range(len(trace)):
        group = (trace.type_names[trace.types[j]], trace.priorities[j], trace.on_demand[j])
        waits.setdefault(group, []).append(result.starts[j] - trace.at[j])
        stranded[group] = stranded.get(group, 0) + result.stranded[j]
    out = []
    for group in sorted(waits):
        ordered = sorted(waits[group])
        out.append(GroupStats(*group, count=len(ordered), wait_p50=percentile(ordered, 50),
                              wait_p99=percentile(ordered, 99), wait_max=ordered[-1],
                              stranded=stranded[group]))
    return out


@dataclass(frozen=True)
class TenantStats:
    tenant: str  # "" is the default tenant
    count: int
    wait_p50: float
    wait_p99: float
    response_mean: float  # wait + run, the mean over its jobs


def tenant_stats(trace: Trace, result: PolicyResult) -> list[TenantStats]:
    """Waits per tenant, in the order the trace names them (the default tenant first)."""
    waits: list[list[float]] = [[] for _ in trace.tenant_names]
    responses = [0.0] * len(trace.tenant_names)
    for j in range(len(trace)):
        g = trace.tenants[j]
        wait = result.starts[j] - trace.at[j]
        waits[g].append(wait)
        responses[g] += wait + trace.durations[j]
    out = []
    for g, name in enumerate(trace.tenant_names):
        if waits[g]:
            ordered = sorted(waits[g])
            out.append(TenantStats(name, len(ordered), percentile(ordered, 50),
                                   percentile(ordered, 99), responses[g] / len(ordered)))
    return out


def jain_index(stats: list[TenantStats], alone: dict[str, float]) -> float:
    """Jain's fairness index, (sum x)^2 / (n x sum x^2), over the tenants' x = mean response
    with the slots to itself / mean response here: 1 when every tenant fares as well as it
    would alone (or all of them equally worse), 1/n when one tenant alone is served as if
    alone and the others not at all."""
    xs = []
    for t in stats:
        base = alone.get(t.tenant, math.nan)
        if t.response_mean > 0 and base == base:
            xs.append(base / t.response_mean)
    if not xs:
        return math.nan
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def report_json(trace: Trace, n_slots: int, results: list[PolicyResult],
                alone: dict[str, float] | None = None) -> dict:
    """`alone`: each tenant's mean response with the slots to itself (simulate.tenant_alone),
    for the per-tenant report and the fairness index; None when the trace has one tenant."""
    policies = {}
    for r in results:
        if alone is not None:
            stats = tenant_stats(trace, r)
            tenants = {"tenants": [vars(t) for t in stats], "jain_index": jain_index(stats, alone)}
        else:
            tenants = {}
        policies[r.policy] = {
            **tenants,
            "groups": [vars(g) for g in group_stats(trace, r)],
            "stranded": sum(r.stranded),
            "makespan": r.makespan,
            "throughput": len(trace) / r.makespan if r.makespan > 0 else None,
            "cycles": r.cycles,
            "events": r.events,
            "wall_seconds": r.wall_seconds,
            "events_per_second": r.events_per_second,
        }
    return {"trace": trace.path, "jobs": len(trace), "slots": n_slots, "policies": policies}


def _seconds(value: float) -> str:
    if value < 100:
        return f"{value:.1f}"
    return f"{value:.0f}"


def tenant_table(trace: Trace, results: list[PolicyResult], alone: dict[str, float]) -> str:
    """Policies side by side: per tenant, wait p50 and p99; then Jain's fairness index."""
    stats = [{t.tenant: t for t in tenant_stats(trace, r)} for r in results]
    head = ["TENANT", "JOBS"] + [f"{r.policy} p50/p99" for r in results]
    rows = [head]
    for name in stats[0]:
        rows.append([name or "(default)", str(stats[0][name].count)]
                    + [f"{_seconds(s[name].wait_p50)}/{_seconds(s[name].wait_p99)}"
                       for s in stats])
    rows.append(["Jain's index", ""] + [f"{jain_index(list(s.values()), alone):.3f}"
                                        for s in stats])
    widths = [max(len(row[c]) for row in rows) for c in range(len(head))]
    lines = ["waits by tenant, in seconds; Jain's index over each tenant's mean response alone "
             "/ here (1: as if alone)"]
    for row in rows:
        lines.append("  ".join(cell.rjust(w) if c > 1 else cell.ljust(w)
                               for c, (cell, w) in enumerate(zip(row, widths, strict=True)))
                     .rstrip())
    return "\n".join(lines)


def report_table(trace: Trace, n_slots: int, results: list[PolicyResult]) -> str:
    """Policies side by side: per (type, priority) group, wait p50/p99/max and stranded."""
    stats = [{(g.type, g.priority, g.on_demand): g for g in group_stats(trace, r)}
             for r in results]
    groups = sorted(stats[0])
    head = ["TYPE", "PRI", "OD", "JOBS"]
    sub = ["", "", "", ""]
    for r in results:
        head += [r.policy, "", "", ""]
        sub += ["p50", "p99", "max", "strd"]
    rows = [head, sub]
    for group in groups:
        row = [group[0], str(group[1]), "yes" if group[2] else "", str(stats[0][group].count)]
        for s in stats:
            g = s[group]
            row += [_seconds(g.wait_p50), _seconds(g.wait_p99), _seconds(g.wait_max),
                    str(g.stranded)]
        rows.append(row)
    # The first four headings are columns of their own; a policy's name spans four.
    widths = [max(len(row[c]) for row in (rows if c < 4 else rows[1:])) for c in range(len(head))]
    for p in range(len(results)):  # a policy's name spans its four columns
        c = 4 + 4 * p
        need = len(head[c]) - (sum(widths[c:c + 4]) + 6)
        if need > 0:
            widths[c + 2] += need
    jobs = f"{len(trace)} job{'' if len(trace) == 1 else 's'}"
    slots = f"{n_slots} slot{'' if n_slots == 1 else 's'}"
    lines = [f"{path_name(trace.path)}: {jobs} on {slots}; waits in seconds"]
    for k, row in enumerate(rows):
        cells = []
        c = 0
        while c < len(row):
            if k == 0 and c >= 4:
                span = sum(widths[c:c + 4]) + 6
                cells.append(row[c].ljust(span))
                c += 4
                continue
            cells.append(row[c].rjust(widths[c]) if c else row[c].ljust(widths[c]))
            c += 1
        lines.append("  ".join(cells).rstrip())
    # Below the table rather than after the first line, which it took to 120 columns.
    lines.append("strd: times a job waited although a better slot choice placed it")
    lines.append("")
    lines.append(f"{'POLICY':<10} {'STRANDED':>9} {'MAKESPAN':>10} {'JOBS/S':>9} "
                 f"{'CYCLES':>9} {'EVENTS/S':>10}")
    for r in results:
        # Jobs that all arrive and end at one instant take no time: no rate to speak of (null
        # in the JSON).
        throughput = _rate(len(trace) / r.makespan) if r.makespan > 0 else "-"
        lines.append(f"{r.policy:<10} {sum(r.stranded):>9} {r.makespan:>10.1f} "
                     f"{throughput:>9} {r.cycles:>9} {r.events_per_second:>10.0f}")
    return "\n".join(lines)


def _rate(per_second: float) -> str:
    """Jobs a second as the table shows them: to the thousandth, or in four significant
    digits past a million (jobs that each take 1e-300 s run at 2e+300 a second, which
    written out took 300 digits)."""
    return f"{per_second:.3f}" if per_second < 1e6 else f"{per_second:.4g}"
