"""[[schedule]] due times, and enqueuing each exactly once across the supervisors sharing a
database (the table fairsched_schedules holds each schedule's last due time enqueued)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from fairsched.store.queue import Queue

if TYPE_CHECKING:
    import psycopg

    from fairsched.config import ScheduleSpec

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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


def enqueue_due(conn: psycopg.Connection, spec: ScheduleSpec) -> Enqueued | None:
    """Enqueue the schedule's latest due time unless it was already (by anyone); a schedule
    seen for the first time only starts its record: its first job is at its next due time.
    `conn` is not in a transaction; this runs one of its own."""
    with conn.transaction():
        due = latest_due(spec, now(conn))
        # FOR UPDATE: two supervisors checking at once queue behind the row lock, and the
        # second reads the time the first wrote, which is no longer before `due`.
        row = conn.execute("SELECT last_due FROM fairsched_schedules WHERE name = %s FOR UPDATE",
                           (spec.name,)).fetchone()
        if row is None:
            # ON CONFLICT: another supervisor may be starting the same record right now.
            conn.execute("INSERT INTO fairsched_schedules (name, last_due) VALUES (%s, %s)"
                         " ON CONFLICT (name) DO NOTHING", (spec.name, due))
            return None
        last = row[0]
        if last >= due:
            return None
        job_id = Queue(conn).enqueue(spec.type, spec.payload, priority=spec.priority)
        # The job's age counts from its due time, not from when a supervisor got to it.
        conn.execute("UPDATE fairsched_jobs SET run_after = %s WHERE id = %s", (due, job_id))
        conn.execute("UPDATE fairsched_schedules SET last_due = %s, last_job = %s"
                     " WHERE name = %s", (due, job_id, spec.name))
    folded = 1
    if spec.every is not None:
        folded = round((due - last).total_seconds() / spec.every)
    return Enqueued(spec.name, due, job_id, max(1, folded))


def last_due_times(conn: psycopg.Connection) -> dict[str, tuple[datetime, int | None]]:
    """Each schedule's last due time enqueued (or recorded at its first check) and its job."""
    return {name: (last, job) for name, last, job in conn.execute(
        "SELECT name, last_due, last_job FROM fairsched_schedules")}
