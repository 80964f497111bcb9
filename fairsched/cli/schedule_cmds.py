"""`fairsched schedules`: each [[schedule]] of workers.toml with its next due time and the last
one enqueued (from the table every supervisor sharing the database writes)."""

from __future__ import annotations

from datetime import datetime

import click

from fairsched.cli import main
from fairsched.cli.common import config_option, output, reports_errors, require_stdout
from fairsched.cli.queue_cmds import json_output, open_queue
from fairsched.config import Config, ScheduleSpec, age_text, load_config, resolve_config_path

SCHEDULE_COLUMNS = ("NAME", "TYPE", "WHEN", "NEXT", "LAST", "LAST JOB")


@main.command(short_help="List the schedules with their next and last due times.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@config_option
@reports_errors
def schedules(as_json, config_path):
    """List each [[schedule]] of workers.toml: its job type, its cron expression or interval,
    its next due time, and the last due time a job was enqueued for (by any supervisor sharing
    the database), in UTC."""
    require_stdout()
    config = load_config(resolve_config_path(config_path))
    rows = schedule_rows(config)
    if as_json:
        output(json_output(rows))
    else:
        output(schedules_table(rows))
    if not rows:
        click.echo(f"no [[schedule]] in {config.path}", err=True)


def schedule_rows(config: Config) -> list[dict]:
    """One mapping per schedule, as --json prints it (times in ISO 8601, UTC)."""
    from fairsched.store.schedules import last_due_times, next_due
    from fairsched.store.schedules import now as database_now

    if not config.schedules:
        return []
    with open_queue(config) as queue:
        clock = database_now(queue.conn)
        recorded = last_due_times(queue.conn)
    return [_row(spec, next_due(spec, clock), recorded.get(spec.name, (None, None)))
            for spec in config.schedules]


def _row(spec: ScheduleSpec, next_time: datetime, recorded: tuple) -> dict:
    last, job = recorded
    return {"name": spec.name, "type": spec.type, "cron": spec.cron, "every": spec.every,
            "priority": spec.priority, "payload": spec.payload, "next": next_time.isoformat(),
            # A due time recorded with no job is where the schedule started: nothing enqueued.
            "last": last.isoformat() if job is not None else None, "last_job": job}


def _time(text: str | None) -> str:
    if text is None:
        return "-"
    return datetime.fromisoformat(text).strftime("%Y-%m-%d %H:%M:%S")


def schedules_table(rows: list[dict]) -> str:
    """The table `fairsched schedules` prints (times in UTC)."""
    lines = [SCHEDULE_COLUMNS]
    for row in rows:
        when = row["cron"] if row["cron"] is not None else f"every {age_text(row['every'])}"
        lines.append((row["name"], row["type"], when, _time(row["next"]), _time(row["last"]),
                      "-" if row["last_job"] is None else str(row["last_job"])))
    widths = [max(len(line[i]) for line in lines) for i in range(len(SCHEDULE_COLUMNS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True))
                     .rstrip() for line in lines)
