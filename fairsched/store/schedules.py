"""[[schedule]] due times, and enqueuing each exactly once across the supervisors sharing a
database (the table fairsched_schedules holds each schedule's last due time enqueued)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from fairsched.store.queue import Queue

if TYPE_CHECKING:
    import psycopg

    from fairsched.config import ScheduleSpec

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Due times one check enqueues one by one at most, for a supervisor that fell behind (each
# check is at the next due time, but a loaded host can be late): past it, folded into one.
MAX_CATCH_UP = 100


def latest_due(spec: ScheduleSpec, now: datetime) -> datetime:
    """The schedule's last due time at or before `now` (cron in UTC; `every` counted from the
    Unix epoch, so that every supervisor, whenever it started, finds the same times)."""
    if spec.every is not None:
        steps = math.floor((now - EPOCH).total_seconds() / spec.every)
        return EPOCH + timedelta(seconds=steps * spec.every)
    from croniter import croniter

    # get_prev is strictly before its start: a microsecond on, `now` itself counts.
    start = now.astimezone(UTC) + timedelta(microseconds=1)
    return croniter(spec.cron, start).get_prev(datetime)


def next_due(spec: ScheduleSpec, now: datetime) -> datetime:
    """The schedule's first due time after `now`."""
    if spec.every is not None:
        return latest_due(spec, now) + timedelta(seconds=spec.every)
    from croniter import croniter

    return croniter(spec.cron, now.astimezone(UTC)).get_next(datetime)


@dataclass(frozen=True)
class Enqueued:
    """A due time this call enqueued: its job, and how many due times it stands for (more
    than one when none was enqueued for a while: those are folded into this one)."""
    name: str
    due: datetime
    job_id: int
    folded: int


def now(conn: psycopg.Connection) -> datetime:
    """The database's clock: every supervisor, on whichever host, reads the same one."""
    return conn.execute("SELECT clock_timestamp()").fetchone()[0]


def due_times_between(spec: ScheduleSpec, after: datetime, until: datetime) -> list[datetime]:
    """The schedule's due times in (after, until], the latest MAX_CATCH_UP of them."""
    if spec.every is not None:
        last = latest_due(spec, until)
        count = math.floor((last - after).total_seconds() / spec.every + 1e-9)
        step = timedelta(seconds=spec.every)
        return [last - k * step for k in reversed(range(min(count, MAX_CATCH_UP)))]
    from croniter import croniter

    times = croniter(spec.cron, after.astimezone(UTC)).all_next(datetime)
    found = deque(maxlen=MAX_CATCH_UP)
    for due in times:
        if due > until:
            break
        found.append(due)
    return list(found)


def enqueue_due(conn: psycopg.Connection, spec: ScheduleSpec,
                since: datetime | None = None) -> tuple[datetime, list[Enqueued]]:
    """Enqueue the schedule's due times not enqueued yet (by anyone); return the latest due
    time now and the jobs enqueued. `since` is the latest due time the caller found at its
    previous check: the times after it came while the caller ran, and each gets its job; those
    before (none ran then, or the caller could not reach the database) are folded into one. A
    first check (`since` None) folds all. A schedule never checked before only starts its
    record: its first job is at its next due time. `conn` is not in a transaction; this runs
    one of its own."""
    with conn.transaction():
        latest = latest_due(spec, now(conn))
        # FOR UPDATE: two supervisors checking at once queue behind the row lock, and the
        # second reads the time the first wrote, which is no longer before its due times.
        row = conn.execute("SELECT last_due FROM fairsched_schedules WHERE name = %s FOR UPDATE",
                           (spec.name,)).fetchone()
        if row is None:
            # ON CONFLICT: another supervisor may be starting the same record right now.
            conn.execute("INSERT INTO fairsched_schedules (name, last_due) VALUES (%s, %s)"
                         " ON CONFLICT (name) DO NOTHING", (spec.name, latest))
            return latest, []
        last = row[0]
        if last >= latest:
            return latest, []
        if since is None or since >= latest:
            dues = [latest]
        else:
            dues = ([since] if last < since else []) + due_times_between(
                spec, max(last, since), latest)
        ids = Queue(conn).enqueue_many(
            [{"type": spec.type, "payload": spec.payload, "priority": spec.priority,
              "tenant": spec.tenant}] * len(dues))
        # A job's age counts from its due time, not from when a supervisor got to it.
        conn.execute("UPDATE fairsched_jobs j SET run_after = d.due"
                     " FROM unnest(%s::bigint[], %s::timestamptz[]) AS d(id, due)"
                     " WHERE j.id = d.id", (ids, dues))
        conn.execute("UPDATE fairsched_schedules SET last_due = %s, last_job = %s"
                     " WHERE name = %s", (latest, ids[-1], spec.name))
    # The first job stands for the due times before it since the last one enqueued.
    folded = [1] * len(dues)
    if spec.every is not None:
        folded[0] = max(1, round((dues[0] - last).total_seconds() / spec.every))
    return latest, [Enqueued(spec.name, due, job_id, n)
                    for due, job_id, n in zip(dues, ids, folded, strict=True)]


def last_due_times(conn: psycopg.Connection) -> dict[str, tuple[datetime, int | None]]:
    """Each schedule's last due time enqueued (or recorded at its first check) and its job."""
    return {name: (last, job) for name, last, job in conn.execute(
        "SELECT name, last_due, last_job FROM fairsched_schedules")}
