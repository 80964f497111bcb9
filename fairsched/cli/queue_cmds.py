"""`fairsched submit`, `jobs`, `retry` and `cancel`: the queue seen from the command line.

Each command is a thin layer over fairsched.store.Queue; every error is one line on stderr with
the exit code the README lists (1: the operation failed, 2: bad usage or configuration).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fairsched.cli import main
from fairsched.cli.common import (
    UsageProblem,
    bound_database_waits,
    clip,
    clip_middle,
    config_option,
    display_width,
    duration,
    output,
    pad,
    parse_int,
    parse_job_id,
    parse_seconds,
    print_outcome,
    printable,
    reports_errors,
    require_stdout,
    terminal_columns,
)
from fairsched.config import (
    AGE_UNITS,
    Config,
    age_seconds,
    age_text,
    load_config,
    resolve_config_path,
)
from fairsched.errors import LongInteger, read_int
from fairsched.files import NotAFile, TooLarge, read_capped
from fairsched.logs import some_ids
from fairsched.store.errors import JobNotFound, JobStateError
from fairsched.store.schema import (
    FINISHED,
    MAX_DELAY,
    MAX_PRIORITY,
    RETRIABLE,
    STATUSES,
    UNFINISHED,
)
from fairsched.type_names import tenant_name_problem, type_name_problem

if TYPE_CHECKING:
    from fairsched.store.queue import Queue


def queue_config(config_path: str | None) -> Config | None:
    """The workers.toml a queue command reads, or None on a host that only names the
    database (FAIRSCHED_DATABASE_URL set, no workers.toml given or here): it queues work for
    workers elsewhere."""
    from fairsched.store.database import ENV_URL

    path = resolve_config_path(config_path)
    if (config_path is None and not os.environ.get("FAIRSCHED_CONFIG")
            and os.environ.get(ENV_URL) and not path.exists()):
        return None
    return load_config(path)


def open_queue(config: Config | None) -> Queue:
    # Imported here: the database driver loads only for the commands that use it.
    from fairsched.store.database import chosen_url
    from fairsched.store.queue import Queue

    bound_database_waits()
    if config is None:  # FAIRSCHED_DATABASE_URL names it: no state_dir to look in
        return Queue.open(Path.cwd(), None, create=True)
    if not chosen_url(config.supervisor.database, config.path):
        config.make_state_dir()  # the embedded database's home: one line naming the setting
    return Queue.open(config.supervisor.state_dir, config.supervisor.database, create=True,
                      config_file=config.path)


# -- submit -----------------------------------------------------------------------------------

# Bytes read from --payload @FILE or -: a payload's JSON laid out with room to spare (it is
# measured compact), and not the memory of a file that never ends.
MAX_PAYLOAD_INPUT = 64 << 20


def parse_payload(text: str | None) -> Any:
    """--payload JSON, or @FILE (the JSON in a file), or - (on standard input): a command
    line holds at most 128 KiB in one argument, a payload up to 512 KiB."""
    if text is None:
        return None
    where = "--payload"
    if text == "@":
        raise UsageProblem("--payload @ names no file: give @PATH, or - for standard input")
    if text == "-" or text.startswith("@"):
        where = "standard input" if text == "-" else f"--payload file {text[1:]!r}"
        try:
            if text == "-":
                if sys.stdin is None:  # closed (`<&-`), so Python made none
                    raise UsageProblem("--payload - reads standard input, which is closed; "
                                       "give the JSON, or @FILE")
                if sys.stdin.isatty():  # else the command seems to hang, waiting for it
                    click.echo("reading the payload's JSON from standard input: end it with "
                               "Ctrl-D at the start of a line", err=True)
                data = sys.stdin.buffer.read(MAX_PAYLOAD_INPUT + 1)
            else:
                data = read_capped(text[1:], MAX_PAYLOAD_INPUT)
            if len(data) > MAX_PAYLOAD_INPUT:  # a stream that never ends, or is no payload
                raise TooLarge(MAX_PAYLOAD_INPUT)
            text = data.decode("utf-8")
        except NotAFile as exc:
            raise UsageProblem(f"{where} {exc}: give a file, or - to read a pipe") from None
        except TooLarge:
            from fairsched.protocol import MAX_PAYLOAD

            raise UsageProblem(f"{where} holds more than {MAX_PAYLOAD_INPUT >> 20} MiB; a "
                               f"payload takes at most {MAX_PAYLOAD >> 10} KiB of JSON") from None
        except OSError as exc:
            raise UsageProblem(f"cannot read {where}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise UsageProblem(f"{where} is not UTF-8 text: {exc.reason} at byte "
                               f"{exc.start}") from None
    try:
        return json.loads(text, parse_constant=_not_a_number, parse_float=_finite,
                          parse_int=read_int)
    except LongInteger as exc:  # valid JSON, that neither this command nor a worker reads
        raise UsageProblem(f"{where} holds {exc}: send a longer one as a string") from None
    except ValueError as exc:
        raise UsageProblem(f"{where} is not valid JSON: {exc}") from None
    except RecursionError:
        raise UsageProblem("--payload nests too deeply") from None


def _not_a_number(token: str):
    # Python's json takes NaN and Infinity; JSON has no such numbers, nor has jsonb.
    raise ValueError(f"{token} is not a JSON number")


def _finite(token: str) -> float:
    value = float(token)
    if math.isinf(value):
        raise ValueError(f"{token} is out of range for a number (at most about 1.8e308)")
    return value


def check_type(config: Config | None, type_name: str) -> None:
    if config is not None and type_name not in config.types:
        raise UsageProblem(config.unknown_type(type_name, suggest=True))


def submit_queued(config: Config | None, type_name: str, payload: Any, *, priority: int,
                  max_attempts: int | None, delay: float, key: str | None,
                  tenant: str | None = None) -> int:
    """Enqueue one job and return its id (the existing job's id for a key in use, when it is
    the same job; another job under that key is KeyConflict, exit 1)."""
    with open_queue(config) as queue:
        return queue.enqueue(type_name, payload, priority=priority, max_attempts=max_attempts,
                             delay=delay, key=key, tenant=tenant)


@main.command(short_help="Enqueue a job (with --on-demand: run it now and wait).")
@click.argument("type_name", metavar="TYPE")
@click.option("--payload", metavar="JSON",
              help="The job's payload, as JSON; @FILE reads it from a file, - from stdin.")
@click.option("--priority", metavar="N", help=f"0 to {MAX_PRIORITY} (default 0).")
@click.option("--max-attempts", metavar="N",
              help="Attempts before the job fails for good (default: the worker's).")
@click.option("--delay", metavar="S", help="Seconds before the job becomes eligible.")
@click.option("--key", metavar="K",
              help="Idempotency key: while a job with this key is unfinished, print its id "
                   "(an error if it is another type, priority or payload).")
@click.option("--tenant", metavar="NAME",
              help="Who the job is for: slots are shared fairly between tenants "
                   "(default: the default tenant).")
@click.option("--on-demand", is_flag=True,
              help="Run it now on the running supervisor, wait, and print the result JSON.")
@click.option("--timeout", metavar="S", help="With --on-demand: give up after S seconds (exit 1).")
@click.option("--socket", "socket_path", metavar="PATH",
              help="With --on-demand: the supervisor's control socket.")
@config_option
@reports_errors
def submit(type_name, payload, priority, max_attempts, delay, key, tenant, on_demand, timeout,
           socket_path, config_path):
    """Enqueue a job of TYPE and print its id (with --on-demand: wait for its result)."""
    problem = type_name_problem(type_name)
    if problem is not None:  # whatever a workers.toml here says: none can run it
        raise UsageProblem(problem)
    payload = parse_payload(payload)
    priority = parse_int("--priority", priority, 0, MAX_PRIORITY) or 0
    if on_demand:
        require_stdout()  # before the job runs: its result is printed, nowhere else
        from fairsched.cli.supervisor_cmds import submit_on_demand

        if max_attempts is not None or delay is not None or key is not None:
            raise UsageProblem("--max-attempts, --delay and --key apply to queued jobs, "
                               "not to --on-demand")
        if tenant is not None:
            raise UsageProblem("--tenant applies to queued jobs, not to --on-demand")
        # Bounded as --delay is: a wait past it (1e308) is no wait a socket can time.
        seconds = (parse_seconds("--timeout", timeout, positive=True, maximum=MAX_DELAY)
                   if timeout is not None else None)
        sys.exit(submit_on_demand(config_path, socket_path, type_name, payload, priority,
                                  seconds))
    if timeout is not None or socket_path is not None:
        raise UsageProblem("--timeout and --socket apply to --on-demand requests only")
    max_attempts = parse_int("--max-attempts", max_attempts, 1, 2**31 - 1)
    delay = parse_seconds("--delay", delay, maximum=MAX_DELAY)
    if key is not None and not key:
        raise UsageProblem("--key must not be empty")
    if tenant is not None and tenant_name_problem(tenant) is not None:
        raise UsageProblem(tenant_name_problem(tenant))
    config = queue_config(config_path)
    check_type(config, type_name)
    job_id = submit_queued(config, type_name, payload, priority=priority,
                           max_attempts=max_attempts, delay=delay, key=key, tenant=tenant)
    print_outcome(str(job_id), f"job {job_id} was queued, but its id could not be printed")


# -- jobs -------------------------------------------------------------------------------------

JSON_TIME_FIELDS = ("created_at", "run_after", "started_at", "finished_at")
MAX_TYPE_COLUMNS = 24  # a longer type is cut short, so one does not widen every row


@main.command(short_help="List jobs, newest first; with IDs, those jobs in full.")
@click.argument("job_ids", metavar="[ID]...", nargs=-1)
@click.option("--status", metavar="S", help=f"Only jobs in this status ({', '.join(STATUSES)}).")
@click.option("--type", "type_name", metavar="T", help="Only jobs of this type.")
@click.option("--limit", metavar="N", help="At most N jobs, newest first (default 100).")
@click.option("--counts", is_flag=True,
              help="Per type: pending (delayed), running and failed jobs, and the oldest wait.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@config_option
@reports_errors
def jobs(job_ids, status, type_name, limit, counts, as_json, config_path):
    """List jobs, newest first; with IDs, each of those jobs in full (its payload, result,
    whole last error and times), whatever its age.

    ATTEMPTS is the attempts made over the job's max_attempts. A job not yet claimed has none
    of its own unless given at submit: it shows its worker group's, or '-' where no
    workers.toml here names its type (this host has none, or none of its groups runs that
    type); --json gives null until it is claimed.
    """
    require_stdout()
    if counts:
        if job_ids or status is not None or limit is not None:
            raise UsageProblem("--counts takes no job IDs, --status nor --limit (--type: one "
                               "type's counts)")
        return show_depth(type_name, as_json, config_path)
    if job_ids:
        if status is not None or type_name is not None or limit is not None:
            raise UsageProblem("give job IDs or --status, --type and --limit, not both")
        sys.exit(show_jobs([parse_job_id(text) for text in job_ids], as_json, config_path))
    if status is not None and status not in STATUSES:
        raise UsageProblem(f"--status must be one of {', '.join(STATUSES)}, got {status!r}")
    limit = parse_int("--limit", limit, 1, 1_000_000) or 100
    config = queue_config(config_path)
    with open_queue(config) as queue:
        rows = queue.list_jobs(status=status, type=type_name, limit=limit)
        # Ages and delays by the server's clock, which set every time in the rows: this
        # host's may be off, and a due job would read as delayed (or the reverse).
        now = queue.server_time()
    if as_json:
        output(json_output([job_json(row) for row in rows]))
    else:
        output(jobs_table(rows, now, config.max_attempts_by_type() if config else {},
                              terminal_columns(sys.stdout)))
    if not rows:
        _hint_typo(config, type_name)


def _hint_typo(config: Config | None, type_name: str | None) -> None:
    """After an empty answer for --type T: a type no group here runs is likely a typo, which
    submit refuses. Said on standard error; the (empty) answer stands."""
    if type_name is not None and config is not None and type_name not in config.types:
        click.echo(config.unknown_type(type_name, suggest=True), err=True)


def show_depth(type_name: str | None, as_json: bool, config_path: str | None) -> None:
    """`fairsched jobs --counts`: the queue by type, the configured types with none too."""
    config = queue_config(config_path)
    limits = config.limits if config else {}
    with open_queue(config) as queue:
        rows = {row["type"]: row for row in queue.depth(type_name)}
        held = queue.limit_holds() if limits else {}
    for name in config.types if config else ():
        if type_name in (None, name):
            rows.setdefault(name, {"type": name, "pending": 0, "delayed": 0, "running": 0,
                                   "failed": 0, "oldest_wait": None})
    rows = [rows[name] for name in sorted(rows)]
    if limits:  # [limits]: at most N at once; on-demand jobs holding a place count too
        for row in rows:
            row["limit"] = limits.get(row["type"])
            row["on_demand_held"] = held.get(row["type"], 0)
    if as_json:
        output(json_output(rows))
        return
    header = ("TYPE", "PENDING", "DELAYED", "RUNNING", "FAILED", "OLDEST WAIT")
    lines = [header] + [
        (clip(printable(row["type"]), MAX_TYPE_COLUMNS), str(row["pending"]),
         str(row["delayed"]), str(row["running"]), str(row["failed"]),
         "-" if row["oldest_wait"] is None else duration(row["oldest_wait"]))
        for row in rows]
    if limits:  # LIMIT: running (queued + on demand) / at most at once
        lines = [lines[0] + ("LIMIT",)] + [
            line + ("-" if row["limit"] is None else
                    f"{row['running'] + row['on_demand_held']}/{row['limit']}",)
            for line, row in zip(lines[1:], rows, strict=True)]
    widths = [max(display_width(line[i]) for line in lines) for i in range(len(lines[0]))]
    output("\n".join("  ".join(pad(cell, w) for cell, w in zip(line, widths, strict=True))
                      .rstrip() for line in lines))
    if not rows:
        _hint_typo(config, type_name)


def show_jobs(ids: list[int], as_json: bool, config_path: str | None) -> int:
    """`fairsched jobs ID...`: each job in full, in the order asked; 1 if one is missing."""
    config = queue_config(config_path)
    with open_queue(config) as queue:
        found_by_id = queue.get_jobs(ids)
        now = queue.server_time()
    rows = {job_id: found_by_id.get(job_id) for job_id in dict.fromkeys(ids)}
    found = [row for row in rows.values() if row is not None]
    if as_json:
        output(json_output([job_json(row) for row in found]))
    elif found:
        max_attempts = config.max_attempts_by_type() if config else {}
        output("\n\n".join(job_details(row, now, max_attempts) for row in found))
    missing = [job_id for job_id, row in rows.items() if row is None]
    for job_id in missing:
        click.echo(f"fairsched: {JobNotFound(job_id)}", err=True)
    return 1 if missing else 0


def job_details(row: dict, now: datetime, max_attempts: dict[str, int]) -> str:
    """One job in full, a field a line; the last error whole, its lines indented."""
    lines = [("job", str(row["id"])), ("type", printable(row["type"])),
             ("status", _status(row, now)), ("priority", str(row["priority"])),
             ("attempts", attempts_text(row, max_attempts, table=False))]
    for label, name in (("created", "created_at"), ("eligible", "run_after"),
                        ("started", "started_at"), ("finished", "finished_at")):
        if row[name] is not None:
            lines.append((label, _when(row[name], now)))
    if row["claimed_by"] is not None:
        lines.append(("claimed by", f"supervisor {row['claimed_by']} (claim {row['claims']})"))
    if row["idempotency_key"] is not None:
        lines.append(("key", printable(row["idempotency_key"])))
    lines.append(("payload", _json_text(row["payload"])))
    if row["result"] is not None or row["status"] == "succeeded":
        lines.append(("result", _json_text(row["result"])))
    if row["last_error"]:
        error = row["last_error"].strip().splitlines() or [""]
        if row["status"] in ("succeeded", "cancelled"):
            error[0] = f"(an earlier attempt) {error[0]}"  # not why it ended as it did
        lines.extend([("last error", printable(error[0]))]
                     + [("", printable(line)) for line in error[1:]])
    # One width for every job, so that the values of jobs shown together line up.
    return "\n".join(f"{label:<10}  {value}".rstrip() for label, value in lines)


def _status(row: dict, now: datetime) -> str:
    """The status as the table shows it: a cancel on its way, a delay still to run."""
    status = row["status"]
    if row["cancel_requested"]:
        return status + " (cancelling)"
    if status == "pending" and row["run_after"] > now:
        return status + f" (in {duration((row['run_after'] - now).total_seconds())})"
    return status


def _when(moment: datetime, now: datetime) -> str:
    """A time in this host's zone, and how long ago (or ahead) by the server's clock."""
    seconds = (now - moment).total_seconds()
    ago = f"{duration(seconds)} ago" if seconds >= 0 else f"in {duration(-seconds)}"
    return f"{moment.astimezone().isoformat(sep=' ', timespec='seconds')} ({ago})"


def _json_text(value: Any) -> str:
    return "null" if value is None else printable(json.dumps(value, ensure_ascii=False))


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def json_output(value: Any) -> str:
    """`value` as --json prints it: non-ASCII text as it is, and a lone surrogate (a result
    may hold one), which no encoding writes, as JSON escapes it."""
    text = json.dumps(value, indent=2, ensure_ascii=False)
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def job_json(row: dict) -> dict:
    out = dict(row)
    for name in JSON_TIME_FIELDS:
        if out[name] is not None:
            out[name] = out[name].isoformat()
    return out


ERROR_COLUMNS = 60  # LAST ERROR into a pipe or a file; on a terminal, up to its edge
LEAST_ERROR_COLUMNS = 20

def attempts_text(row: dict, max_attempts: dict[str, int], *, table: bool = True) -> str:
    """ATTEMPTS: 2/3 while a job may still be tried (3 being its max_attempts, that of its
    type's worker group before it is claimed, `-` when no worker handles it); for a finished
    job how many tries it had, no more to come, with its max_attempts aside in full view."""
    maximum = row["max_attempts"] or max_attempts.get(row["type"], "-")
    if row["status"] not in FINISHED:
        return f"{row['attempts']}/{maximum}"
    return str(row["attempts"]) if table else f"{row['attempts']} (max_attempts {maximum})"


def jobs_table(rows: list[dict], now: datetime, max_attempts: dict[str, int],
               width: int | None = None) -> str:
    """The human table. AGE counts from when the job last became eligible (run_after: its
    submit or delay, a retry), as its score does. LAST ERROR is its first line, cut in the
    middle so that what failed and why both show, at ERROR_COLUMNS or, with `width` (the
    terminal's), at its edge."""
    lines = [("ID", "TYPE", "PRI", "STATUS", "ATTEMPTS", "AGE")]
    errors = [("", "LAST ERROR")]
    for row in rows:
        error = first_line(row["last_error"], width or ERROR_COLUMNS)
        # An error kept from before a retry is not why the job ended as it did.
        earlier = ("(an earlier attempt) " if error and row["status"] in ("succeeded", "cancelled")
                   else "")
        errors.append((earlier, error))
        lines.append((str(row["id"]), clip(printable(row["type"]), MAX_TYPE_COLUMNS),
                      str(row["priority"]), _status(row, now), attempts_text(row, max_attempts),
                      duration((now - row["run_after"]).total_seconds())))
    # In terminal columns, not characters: a CJK or emoji type takes two per character.
    widths = [max(display_width(line[i]) for line in lines) for i in range(len(lines[0]))]
    room = ERROR_COLUMNS if width is None else max(
        width - sum(widths) - 2 * len(widths), LEAST_ERROR_COLUMNS)
    return "\n".join(
        ("  ".join(pad(cell, w) for cell, w in zip(line, widths, strict=True)) + "  " + earlier
         + clip_middle(error, max(room - display_width(earlier), LEAST_ERROR_COLUMNS))).rstrip()
        for line, (earlier, error) in zip(lines, errors, strict=True))


_LINE_BREAK = re.compile("[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")


def first_line(error: str | None, columns: int) -> str:
    """The first line of `error`, printable: whole when it fits in a LAST ERROR cell of
    `columns`, else its start and its end with enough of each for clip_middle. An error may
    be a whole document: only those ends of it are read."""
    error = (error or "").strip()
    end = _LINE_BREAK.search(error)
    line = error if end is None else error[:end.start()]
    keep = 4 * columns + 256  # zero-width characters aside, each takes a column or more
    if len(line) > 2 * keep:
        # The middle goes in any case: a marker there, whatever the ends need.
        return printable(line[:keep]) + "…" + printable(line[-keep:])
    return printable(line)


# -- retry, cancel ----------------------------------------------------------------------------

@main.command(short_help="Put failed or cancelled jobs back in the queue.")
@click.argument("job_ids", metavar="[ID]...", nargs=-1)
@click.option("--status", metavar="S",
              help="Every job in this status (failed or cancelled), in one statement.")
@click.option("--type", "type_name", metavar="T", help="With --status: only jobs of this type.")
@click.option("--max-attempts", metavar="N",
              help="A new budget of attempts (default: each job keeps its max_attempts).")
@config_option
@reports_errors
def retry(job_ids, status, type_name, max_attempts, config_path):
    """Put failed or cancelled jobs back in the queue, their attempts reset to 0: those
    given by ID, or with --status every job in that status (of --type T).

    A job keeps the max_attempts it was given, at submit or by its worker group when it
    was first claimed, even if the group's max_attempts has changed since; --max-attempts
    gives it a new one. A job of a type no group in workers.toml runs is retried all the
    same (a supervisor elsewhere may run it), with a warning. Exit 1 if a job could not be
    retried (each is named).
    """
    ids = _ids_or_status("retry", job_ids, status, type_name, RETRIABLE)
    max_attempts = parse_int("--max-attempts", max_attempts, 1, 2**31 - 1)
    config = queue_config(config_path)
    with open_queue(config) as queue:
        if status is None:
            def retry_one(job_id: int) -> None:
                retried = queue.retry_job(job_id, max_attempts=max_attempts)
                said(f"job {job_id} is pending again")
                _note_unknown_type(config, retried, f"job {job_id} waits")

            sys.exit(_each(ids, retry_one))
        retried, left = queue.retry_jobs(status, type_name, max_attempts=max_attempts)
    which = _jobs_named(len(retried), status, type_name)
    said(f"{which} pending again" if retried else f"{which} to retry")
    if not retried and not left:
        _hint_typo(config, type_name)
    for other in sorted(set(retried.values())):
        _note_unknown_type(config, other, "they wait")
    if left:
        one = len(left) == 1
        click.echo(f"fairsched: {_jobs_named(len(left), status)} left as "
                   f"{'it was' if one else 'they were'}: an unfinished job holds "
                   f"{'its' if one else 'their'} idempotency key: {some_ids(left)}", err=True)
        sys.exit(1)


@main.command(short_help="Cancel pending jobs, or stop running ones.")
@click.argument("job_ids", metavar="[ID]...", nargs=-1)
@click.option("--status", metavar="S",
              help="Every job in this status (pending or running), in one statement.")
@click.option("--type", "type_name", metavar="T", help="With --status: only jobs of this type.")
@config_option
@reports_errors
def cancel(job_ids, status, type_name, config_path):
    """Cancel pending jobs, or ask the supervisors running them to stop them: those given by
    ID, or with --status every job in that status (of --type T). Exit 1 if a job could not
    be cancelled (each is named)."""
    ids = _ids_or_status("cancel", job_ids, status, type_name, UNFINISHED)
    config = queue_config(config_path)
    with open_queue(config) as queue:
        if status is None:
            def cancel_one(job_id: int) -> None:
                if queue.cancel_job(job_id) == "cancelled":
                    said(f"job {job_id} cancelled")
                else:
                    said(f"job {job_id} is running: cancel requested")

            sys.exit(_each(ids, cancel_one))
        cancelled = queue.cancel_jobs(status, type_name)
    which = _jobs_named(len(cancelled), status, type_name)
    if not cancelled:
        said(f"{which} to cancel")
        _hint_typo(config, type_name)
    else:
        said(f"{which} cancelled" if status == "pending" else f"{which}: cancel requested")


def _ids_or_status(verb: str, job_ids: tuple[str, ...], status: str | None,
                   type_name: str | None, statuses: tuple[str, ...]) -> list[int]:
    """The job ids given to `verb`, or [] for every job in `status`: one or the other."""
    if job_ids and (status is not None or type_name is not None):
        raise UsageProblem("give job IDs or --status (and --type), not both")
    if not job_ids and status is None:
        raise UsageProblem(f"give the IDs of the jobs to {verb}, or --status {statuses[0]} (or "
                           f"{statuses[1]}) for every job in that status"
                           + (" of that type" if type_name is not None else ""))
    if status is not None and status not in statuses:
        raise UsageProblem(f"--status must be {' or '.join(statuses)}, got {status!r}")
    return [parse_job_id(text) for text in job_ids]


def _each(ids: list[int], act) -> int:
    """act(id) for each job in turn: one it cannot act on is named and the rest go on (exit
    1 in the end); the only one given fails the command as it is."""
    failed = False
    for job_id in dict.fromkeys(ids):
        try:
            act(job_id)
        except (JobNotFound, JobStateError) as exc:
            if len(ids) == 1:
                raise
            click.echo(f"fairsched: {exc}", err=True)
            failed = True
    return 1 if failed else 0


def _jobs_named(count: int, status: str, type_name: str | None = None) -> str:
    """'3 failed jobs of type pdf', as the bulk commands count what they did ('no failed
    jobs' for none)."""
    return (f"{count or 'no'} {status} job{'' if count == 1 else 's'}"
            + (f" of type {printable(type_name)}" if type_name is not None else ""))


def said(line: str) -> None:
    print_outcome(line, f"{line}, but this could not be printed")


def _note_unknown_type(config: Config | None, type_name: str, waiting: str) -> None:
    if config is not None and type_name not in config.types:
        # Retried all the same: a supervisor on another host sharing the database may run it.
        click.echo(f"{config.unknown_type(type_name)}: {waiting} for a supervisor whose "
                   "workers.toml does", err=True)


# -- prune ------------------------------------------------------------------------------------

def parse_age(option: str, text: str) -> float:
    """An age such as 30d, 12h, 45m, 90s or 90 (seconds)."""
    try:
        return age_seconds(text)
    except ValueError as exc:
        raise UsageProblem(f"{option} {exc}") from None


@main.command(short_help="Delete finished jobs older than an age.")
@click.option("--older-than", "age", metavar="AGE", required=True,
              help="Jobs that finished longer ago than this: 30d, 12h, 45m, 90s.")
@click.option("--status", "statuses", metavar="S", multiple=True,
              help="Jobs in this status (succeeded, failed, cancelled; may be given more than "
                   "once). Default: succeeded and cancelled; the failed ones, the dead-letter "
                   "list, are kept unless named.")
@click.option("--type", "type_name", metavar="T", help="Only jobs of this type.")
@click.option("--dry-run", is_flag=True, help="Count them; delete nothing.")
@config_option
@reports_errors
def prune(age, statuses, type_name, dry_run, config_path):
    """Delete finished jobs that finished longer ago than --older-than, by the database
    server's clock, a batch of rows at a time. Pending and running jobs are never touched."""
    seconds = parse_age("--older-than", age)
    statuses = list(dict.fromkeys(statuses)) or ["succeeded", "cancelled"]
    for status in statuses:
        if status not in FINISHED:
            raise UsageProblem(f"--status must be one of {', '.join(FINISHED)}, got {status!r}")
    config = queue_config(config_path)
    with open_queue(config) as queue:
        count = queue.prune_jobs(seconds, statuses, type_name, dry_run=dry_run)
    which = _jobs_named(count, ' or '.join(statuses), type_name)
    if not seconds:  # "finished more than 0 ago": every one that has finished
        which += " of any age"
    else:  # a bare number is seconds: said with its unit, "90" as 90s and "7200" as 2h
        which += f" finished more than {age if age[-1] in AGE_UNITS else age_text(seconds)} ago"
    said(f"{which} would be deleted" if dry_run else f"deleted {which}")
    if not count:
        _hint_typo(config, type_name)
