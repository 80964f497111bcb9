"""The `ps` snapshot: one row per slot, built from the actor's state in one pass."""

from __future__ import annotations

import os
import time

from fairsched import __version__, core
from fairsched.supervisor.states import SLOT_STATE, ProcessState


def snapshot(sup) -> dict:
    now = time.time()
    mono = time.monotonic()
    slots = []
    for proc in sup.workers.procs:
        uptime = now - proc.life.started_at if proc.life.pid is not None and proc.life.started_at else None
        base = {
            "worker": proc.name,
            "group": proc.group,
            "pid": proc.life.pid,
            "types": list(proc.life.types or proc.spec.types),
            "restarts": proc.restarts,
            "uptime": round(uptime, 3) if uptime is not None else None,
            "process_state": proc.state.value,
            "last_exit": proc.last_exit,
            # The process that replaced the one last_exit tells of runs fine since.
            "recovered": proc.recovered(mono),
            "fatal_reason": proc.fatal_reason,
            # Recycling: jobs run by this process against its max_jobs (drawn for it), the
            # group's memory limits in bytes, and why it is being replaced, if it is.
            "jobs_done": proc.life.jobs_done,
            "max_jobs": proc.life.max_jobs,
            "max_rss": proc.spec.max_rss,
            "rss_limit": proc.spec.rss_limit,
            "recycling": proc.life.recycling,
            # A reload stops it once its jobs end: "removed" (for good), "replaced" (by one
            # with the group's new settings), else None.
            "retiring": ("removed" if proc.removed else
                         "replaced" if proc.life.retiring else None),
        }
        for index, state, rj in slot_states(sup, proc):
            slots.append(_row(base, index, state, rj, mono))
    supervisor = {
        "pid": os.getpid(),
        "id": sup.queue.supervisor_id,
        "version": __version__,
        "uptime": round(now - sup.started, 3),
        "started_at": sup.started,
        "config": str(sup.config.path),
        "state_dir": str(sup.config.supervisor.state_dir),
        "database": sup.queue.kind,
        "database_connected": sup.queue.connected,
        "lease_lost": sup.lease.fenced,
        "core": core.__impl__,
        "shutting_down": sup.shutting_down,
        "waiting_on_demand": sup.planner.n_waiting_requests,
        "counters": sup.counters(),
        "groups": groups(sup),
        "limits": limits(sup),
    }
    return {"supervisor": supervisor, "slots": slots}


def limits(sup) -> dict:
    """[limits]: each limited type's limit, its jobs running across every supervisor as of
    the last heartbeat (None before the first), those running here, and whether this
    supervisor found it full at its last claim."""
    here: dict[str, int] = {}
    for rj in sup.jobs.running.values():
        here[rj.type] = here.get(rj.type, 0) + 1
    full = set(sup.planner.types_at_limit())
    return {t: {"limit": n, "running": sup.queue.limit_running.get(t),
                "running_here": here.get(t, 0), "at_limit": t in full}
            for t, n in sorted(sup.config.limits.items())}


def groups(sup) -> dict:
    """Each worker group's processes now (those stopping for good, as the group shrinks, left
    out), and its range: min and max are equal but for an autoscaled group."""
    shown = {}
    for spec in sup.config.workers:
        low, high = spec.process_range
        shown[spec.name] = {"processes": sup.workers.size(spec.name), "min": low, "max": high,
                            "autoscaled": spec.autoscaled}
    return shown


def slot_states(sup, proc):
    """(slot index, state, running job or None) for each slot of `proc`, as `ps` shows them;
    the metrics count the same states."""
    if not proc.life.slot_ids:
        state = SLOT_STATE.get(proc.state, proc.state.value)
        if proc.state is ProcessState.DOWN and sup.workers.warming(proc.group):
            state = "starting"  # its template is still importing the handler
        for index in range(proc.spec.slots):
            yield index, state, None
        return
    for index, sid in enumerate(proc.life.slot_ids):
        rj = sup.jobs.on_slot(sid)
        in_pool, busy = sup.planner.slot_state(sid)
        # A slot out of the index takes no more work: its worker is on its way out
        # (stopped by a SIGTERM from elsewhere, or its pipe broke), whatever it runs.
        if (proc.state is ProcessState.STOPPING or proc.life.retiring
                or (rj is None and (sup.shutting_down or not in_pool))):
            yield index, "stopping", rj
        elif rj is not None or busy:
            yield index, "busy", rj
        else:
            yield index, "free", rj


def _row(base: dict, index: int, state: str, rj, mono: float) -> dict:
    row = dict(base)
    row["slot"] = index
    row["state"] = state
    row["job_id"] = rj.job_id if rj is not None else None
    row["job_type"] = rj.type if rj is not None else None
    row["job_age"] = round(mono - rj.started_mono, 3) if rj is not None else None
    row["attempt"] = rj.attempt if rj is not None else None
    row["progress"] = rj.progress if rj is not None else None
    row["message"] = rj.message if rj is not None else None
    # Why a cancel was sent to its job and not yet answered: "user" (fairsched cancel),
    # "caller" (its on-demand caller left), "shutdown", "restart", "lease"; or None.
    row["cancelling"] = rj.cancel_reason if rj is not None else None
    return row
