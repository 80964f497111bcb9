"""`fairsched supervise`, `ps`, `restart`, `reload`, `stop` and the on-demand side of `submit`."""

from __future__ import annotations

import itertools
import json
import logging
import signal
import sys
import time
from pathlib import Path

import click

from fairsched.cli import main
from fairsched.cli.common import (
    UsageProblem,
    can_redraw,
    clip,
    config_option,
    display_width,
    duration,
    expected_error,
    fail,
    output,
    pad,
    parse_seconds,
    print_outcome,
    printable,
    reports_errors,
    require_stdout,
    terminal_columns,
)
from fairsched.config import control_socket_of, load_config, resolve_config_path
from fairsched.control_client import ControlClient, NoAnswer, NoSupervisor, NotRunning
from fairsched.logs import one_line

ANSWER_WITHIN = 30.0  # seconds a supervisor has to answer a command (not to carry it out)

socket_option = click.option(
    "--socket", "socket_path", metavar="PATH", help="The supervisor's control socket.")


def control_client(config_path: str | None, socket_path: str | None,
                   timeout: float | None = ANSWER_WITHIN) -> ControlClient:
    if socket_path:
        return ControlClient(Path(socket_path), timeout)
    return ControlClient(control_socket_of(resolve_config_path(config_path)), timeout)


@main.command()
@config_option
@click.option("--log-format", type=click.Choice(["text", "json"], case_sensitive=False),
              default="text",
              show_default=True,
              help="The log on standard error: lines of text, or one JSON object per line.")
@click.option("--log-level",
              type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
              default="info", show_default=True,
              help="The least severe lines logged (warning: problems only).")
@reports_errors
def supervise(config_path, log_format, log_level):
    """Run the supervisor in the foreground."""
    from fairsched.logs import setup_logging
    from fairsched.supervisor.control import AlreadyRunning
    from fairsched.supervisor.main import run_supervisor
    from fairsched.worker._linux import reopen_standard_streams

    # Any of fds 0-2 it was started without, before its lock file or a socket takes the number.
    reopen_standard_streams()
    setup_logging(log_format, log_level)  # first: a bad config is told in the log's format
    config = load_config(resolve_config_path(config_path))
    try:
        code = run_supervisor(config)
    except AlreadyRunning as exc:
        fail(str(exc), 2)
    except Exception as exc:
        if expected_error(exc):
            raise  # reports_errors: one line, the contract's exit code
        # A bug: its traceback goes to the log, in the log's format (JSON lines included).
        logging.getLogger("fairsched").exception("the supervisor failed: %s", exc)
        sys.exit(1)
    sys.exit(code)


@main.command(short_help="One row per slot: its worker, state, job and progress.")
@config_option
@socket_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.option("--watch", is_flag=True,
              help="Redraw every second until Ctrl-C, waiting through the supervisor's stops "
                   "and restarts (not a terminal, or TERM=dumb: print each refresh after a "
                   "blank line).")
@reports_errors
def ps(config_path, socket_path, as_json, watch):
    """One row per slot: worker, pid, slot, types, state, job, age, progress, restarts, uptime,
    RSS, CPU."""
    require_stdout()
    client = control_client(config_path, socket_path)
    if watch:
        # Ctrl-C (SIGINT) ends the watch even where it was inherited ignored, as it is by a
        # background job of a shell script.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    redraw = watch and can_redraw(sys.stdout)
    away = None  # while watching: why the supervisor does not answer, and since when
    try:
        for refresh in itertools.count():
            if refresh:
                time.sleep(1.0)
            try:
                data = add_process_figures(client.ps())
            except (NotRunning, NoAnswer) as exc:
                if not refresh:
                    raise
                # Stopped or restarted (systemctl restart, say): the watch waits for it.
                if away is None:
                    away = (str(exc), time.strftime("%H:%M:%S"))
                    if as_json:
                        click.echo(f"fairsched: {exc}; waiting for it", err=True)
                text = f"{away[0]}\nwaiting for it since {away[1]} (Ctrl-C to leave)\n"
            else:
                away = None
                if as_json:
                    output(json.dumps(data, indent=None if watch else 2))
                else:
                    text = render_ps(data, terminal_columns(sys.stdout))
            if not as_json:
                _draw(text, redraw, refresh)
            if not watch:
                return
    except KeyboardInterrupt:
        if sys.stdout.isatty():  # the line the terminal's ^C began ends
            click.echo("")


def _draw(text: str, redraw: bool, refresh: int) -> None:
    if redraw:
        # Drawn over the last table, each line erased only to its end, and what is left
        # below it after: clearing the screen first made it flicker.
        text = "\x1b[H" + text.replace("\n", "\x1b[K\n") + "\x1b[J"
    elif refresh:  # a pipe, a log, a dumb terminal: one table after another
        text = "\n" + text
    output(text, nl=False)


@main.command(short_help="Restart a worker group or process, fatal ones included.")
@click.argument("name")
@config_option
@socket_option
@reports_errors
def restart(name, config_path, socket_path):
    """Restart a worker group (pdf) or one process (pdf-1), fatal ones included, with the
    handler's code as it is now."""
    client = control_client(config_path, socket_path)
    reply = client.request({"cmd": "restart", "name": name})
    if not reply.get("ok") and isinstance(reply.get("error"), str):
        fail(reply["error"], 2 if reply.get("code") == 2 else 1)
    restarted = reply.get("restarted")
    if not (reply.get("ok") and isinstance(restarted, list)):
        raise client.not_a_supervisor(reply)
    said = f"restarting {', '.join(map(str, restarted))}"
    print_outcome(said, f"{said}, but this could not be printed")


@main.command(short_help="Read workers.toml again and apply what changed.")
@config_option
@socket_option
@reports_errors
def reload(config_path, socket_path):
    """Have the running supervisor read its workers.toml again and apply what changed: new
    groups start, removed ones stop once their jobs end, changed ones have their processes
    replaced one at a time, [scoring] counts from the next cycle. A bad file, or one that
    changes a setting only a restart takes (state_dir, database...), changes nothing: exit 2.
    Prints what changed, one line per group. (SIGHUP to the supervisor does the same.)"""
    client = control_client(config_path, socket_path)
    reply = client.request({"cmd": "reload"})
    if not reply.get("ok") and isinstance(reply.get("error"), str):
        fail(reply["error"], 2 if reply.get("code") == 2 else 1)
    changes = reply.get("changes")
    if not (reply.get("ok") and isinstance(changes, dict)
            and isinstance(changes.get("lines"), list)):
        raise client.not_a_supervisor(reply)
    said = "\n".join(f"reloaded: {printable(str(line))}" for line in changes["lines"])
    print_outcome(said, "reloaded, but what changed could not be printed")


@main.command()
@config_option
@socket_option
@click.option("--timeout", metavar="S",
              help="Seconds to let running jobs finish (default: shutdown_timeout).")
@reports_errors
def stop(config_path, socket_path, timeout):
    """Stop the supervisor gracefully and wait until it has exited. With none running there
    is nothing to do: exit 0, saying so on stderr."""
    timeout = parse_seconds("--timeout", timeout) if timeout is not None else None
    client = control_client(config_path, socket_path)
    # The shutdown takes its time; the answer that it began does not.
    replies = client.stream({"cmd": "stop", "timeout": timeout}, timeout=ANSWER_WITHIN,
                            then=None)
    try:
        first = next(replies, None)  # NoAnswer after ANSWER_WITHIN: one line, exit 1
    except NoSupervisor:
        # Stopped is what was asked for, as `systemctl stop` of a stopped unit: a script's
        # `fairsched stop` before an upgrade need not tell "already stopped" from a failure.
        click.echo(f"fairsched: no supervisor is running on {client.name}: nothing to stop",
                   err=True)
        return
    if first is not None and not first.get("ok") and isinstance(first.get("error"), str):
        fail(f"the supervisor did not accept the stop request: {first['error']}",
             2 if first.get("code") == 2 else 1)
    if not first:
        fail("the supervisor did not accept the stop request: no answer", 1)
    pid = first.get("pid")
    if not (first.get("ok") and isinstance(pid, int) and not isinstance(pid, bool) and pid > 0):
        raise client.not_a_supervisor(first)
    for _ in replies:  # the connection closes when the supervisor has stopped
        pass
    import psutil  # here: `supervise` and `submit` start 10 ms sooner without it

    deadline = time.monotonic() + 10
    while pid and psutil.pid_exists(pid) and time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.02)
    said = f"supervisor {pid} stopped"
    print_outcome(said, f"{said}, but this could not be printed")


def submit_on_demand(config_path, socket_path, type_name, payload, priority, timeout) -> int:
    """Send an on-demand request, print progress to stderr and the result JSON; exit code."""
    from fairsched.protocol import MAX_DEPTH, MAX_PAYLOAD, json_depth, payload_json

    try:
        text, size = payload_json(payload)
    except ValueError as exc:  # NaN or Infinity: json.loads takes them, frames do not
        raise UsageProblem(f"payload: {exc}") from None
    except RecursionError:  # read, but too deep to write out again
        raise UsageProblem(f"payload nests deeper than {MAX_DEPTH} levels") from None
    if size > MAX_PAYLOAD:  # measured as the supervisor does: refused before it is sent
        raise UsageProblem(f"payload is {size} bytes of JSON; at most {MAX_PAYLOAD} fit in the "
                           "frame that takes it to a worker (pass a path or a URL instead)")
    # Refused here as the supervisor would: nested nearly as deep as JSON can be read at all,
    # the request might not even be read there.
    if json_depth(text) > MAX_DEPTH:
        raise UsageProblem(f"payload nests deeper than {MAX_DEPTH} levels")
    client = control_client(config_path, socket_path, timeout=None)
    request = {"cmd": "submit", "type": type_name, "payload": payload, "priority": priority,
               "timeout": timeout}
    show_progress = can_redraw(sys.stderr)  # redrawn in place: only where that works
    # With a timeout, the supervisor says how the request ended once it has run out: one that
    # says nothing for ANSWER_WITHIN longer is stalled (stopped with SIGSTOP, say).
    waiting = None if timeout is None else timeout + ANSWER_WITHIN
    job_id = None
    try:
        for event in client.stream(request, timeout=waiting):
            job_id = event.get("job_id", job_id)
            if not isinstance(event.get("event"), str):
                raise client.not_a_supervisor(event)
            code = _on_demand_event(event, show_progress)
            if code is not None:
                return code
    except KeyboardInterrupt:
        # The supervisor withdraws a request whose caller left, and asks its handler to stop.
        from fairsched.cli import interrupted

        interrupted(f": job {job_id} withdrawn" if job_id else ": the request is withdrawn")
    except Exception:  # a lost connection, say: its line is written after this one
        _clear_progress(show_progress)
        raise
    _clear_progress(show_progress)
    fail("the supervisor closed the connection before the job finished", 1)
    return 1


def _clear_progress(show_progress: bool) -> None:
    """Erase the progress line drawn so far: what is said next starts a line of its own."""
    if show_progress:
        click.echo("\r\x1b[K", err=True, nl=False)


def _draw_progress(line: str) -> None:
    """Draw `line` over the progress line drawn so far."""
    # A line wider than the terminal wraps, and a carriage return goes back to the start of
    # its last row only: each redraw would leave the rows above it on the screen.
    columns = terminal_columns(sys.stderr)
    if columns is not None:
        line = clip(line, max(columns - 1, 1))
    click.echo(f"\r{line}\x1b[K", err=True, nl=False)


def _on_demand_event(event: dict, show_progress: bool) -> int | None:
    """Show one event of an on-demand request: its exit code once it is the last one."""
    kind = event.get("event")
    if kind in ("refused", "result", "error", "timeout"):  # the last event
        _clear_progress(show_progress)
    if kind == "refused":
        fail(str(event.get("error", "refused")), 1 if event.get("code") == 1 else 2)
    elif kind == "progress" and show_progress:
        fraction = event.get("fraction")
        pct = f"{fraction * 100:5.1f}% " if isinstance(fraction, int | float) else ""
        message = printable(str(event.get("message") or ""))[:200]  # one line, redrawn
        _draw_progress(f"{event['job_id']}: {pct}{message}")
    elif kind == "retry" and show_progress:  # else the failed attempt's progress stays drawn
        error = printable(one_line(str(event.get("error"))))[:200]
        _draw_progress(f"{event['job_id']}: attempt {event.get('attempt')} failed ({error}); "
                       "trying again")
    elif kind == "result":
        output(json.dumps(event.get("result")))
        return 0
    elif kind == "error":
        attempts = event.get("attempts")
        after = (f" after {attempts} attempts" if isinstance(attempts, int)
                 and not isinstance(attempts, bool) and attempts > 1 else "")
        fail(f"job {event.get('job_id')} failed{after}: "
             f"{printable(one_line(str(event.get('error'))))}", 1)
    elif kind == "timeout":
        fail(f"job {event.get('job_id')}: {event.get('error')}", 1)
    return None


def add_process_figures(data: dict) -> dict:
    """RSS and CPU seconds per worker process, and whether a signal has it stopped (SIGSTOP,
    Ctrl-Z), read here with psutil (same host)."""
    import psutil

    halted = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    cache: dict[int, tuple] = {}
    for row in data["slots"]:
        pid = row.get("pid")
        if pid and pid not in cache:
            try:
                p = psutil.Process(pid)
                with p.oneshot():
                    times = p.cpu_times()
                    cache[pid] = (p.memory_info().rss, round(times.user + times.system, 2),
                                  p.status() in halted)
            except psutil.Error:
                cache[pid] = (None, None, False)
        row["rss"], row["cpu"], row["suspended"] = (cache.get(pid, (None, None, False)) if pid
                                                    else (None, None, False))
    return data


def _duration(seconds) -> str:
    return "-" if seconds is None else duration(float(seconds), tenths=True)


def _bytes(n, tight: bool = False) -> str:
    """41.3M; `tight`: a whole number without its ".0" (a limit: 400M, 1.5G)."""
    if n is None:
        return "-"
    for unit in ("B", "K", "M", "G"):
        if n < 1024 or unit == "G":
            if unit == "B":
                return f"{n:.0f}{unit}"
            shown = f"{n:.1f}"
            return (shown.removesuffix(".0") if tight else shown) + unit
        n /= 1024
    return str(n)


def _rss(slot: dict) -> str:
    """RSS, and the group's max_rss (else rss_limit) after a slash when it has one."""
    limit = slot.get("max_rss") or slot.get("rss_limit")
    rss = _bytes(slot.get("rss"))
    if not limit:
        return rss
    return f"{rss}/{_bytes(limit, tight=True)}"


PROGRESS_COLUMNS = 30  # a longer message is cut short, so one does not widen every row


PS_COLUMNS = ["WORKER", "PID", "SLOT", "TYPES", "STATE", "JOB", "AGE", "PROGRESS", "RESTARTS",
              "UPTIME", "RSS", "CPU"]
# On a terminal narrower than the table: the columns left out first, then the ones cut short
# (to no fewer columns than this), so that rows do not wrap.
PS_LEFT_OUT = ["CPU", "RSS", "UPTIME"]
PS_CUT_SHORT = {"PROGRESS": 12, "TYPES": 12}


def fit_columns(rows: list[list[str]], width: int) -> list[list[str]]:
    """`rows` (the header first) with columns left out or cut short until they fit in
    `width` terminal columns, as far as PS_LEFT_OUT and PS_CUT_SHORT allow."""
    def total(rows):
        return sum(max(display_width(r[i]) for r in rows) for i in range(len(rows[0]))) \
            + 2 * (len(rows[0]) - 1)

    for name in PS_LEFT_OUT:
        if total(rows) <= width:
            return rows
        i = rows[0].index(name)
        rows = [r[:i] + r[i + 1:] for r in rows]
    for name, least in PS_CUT_SHORT.items():
        excess = total(rows) - width
        if excess <= 0:
            return rows
        i = rows[0].index(name)
        room = max(least, max(display_width(r[i]) for r in rows) - excess)
        rows = [r[:i] + [clip(r[i], room)] + r[i + 1:] for r in rows]
    return rows


def render_ps(data: dict, width: int | None = None) -> str:
    """The table of `fairsched ps`; with `width`, narrowed to that many terminal columns as
    far as it can be."""
    sup = data["supervisor"]
    db = sup["database"] + ("" if sup.get("database_connected", True) else " (disconnected)")
    if sup.get("lease_lost"):
        db += ", lease lost: queued jobs given back, claiming stopped"
    fields = [f"supervisor pid {sup['pid']}", f"up {_duration(sup['uptime'])}",
              f"database {db}", f"core {sup['core']}",
              f"on-demand waiting {sup.get('waiting_on_demand', 0)}"]
    # Autoscaled groups: how many processes now, in what range ("pdf 3 of 1..8 processes").
    fields += [f"{name} {g['processes']} of {g['min']}..{g['max']} processes"
               for name, g in sup.get("groups", {}).items() if g.get("autoscaled")]
    # [limits]: "limit pdf 2/3" (running across every supervisor / at most at once).
    fields += [f"limit {name} {'?' if lim['running'] is None else lim['running']}/{lim['limit']}"
               + (" full" if lim.get("at_limit") else "")
               for name, lim in sup.get("limits", {}).items()]
    if sup.get("shutting_down"):
        fields.append("SHUTTING DOWN")
    lines = wrap(fields, width, "  ")
    rows = [PS_COLUMNS]
    for s in data["slots"]:
        progress = "-"
        if s.get("progress") is not None or s.get("message"):
            pct = f"{s['progress'] * 100:.0f}%" if s.get("progress") is not None else ""
            progress = clip(" ".join(x for x in (pct, printable(s.get("message") or "")) if x),
                            PROGRESS_COLUMNS, mark="")
        if s.get("cancelling"):
            progress = "cancelling" + clip("" if progress == "-" else f"; {progress}",
                                           PROGRESS_COLUMNS, mark="")
        rows.append([
            s["worker"], str(s["pid"] or "-"), str(s["slot"]), ",".join(s["types"]), s["state"],
            str(s["job_id"]) if s["job_id"] is not None else "-", _duration(s.get("job_age")),
            progress, str(s["restarts"]), _duration(s.get("uptime")), _rss(s),
            f"{s['cpu']:.2f}s" if s.get("cpu") is not None else "-",
        ])
    if width is not None:
        rows = fit_columns(rows, width)
    # In terminal columns, not characters: a CJK or emoji message takes two per character.
    widths = [max(display_width(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        lines.append("  ".join(pad(c, w) for c, w in zip(r, widths, strict=True)).rstrip())
    for s in data["slots"]:
        if s["slot"] != 0:
            continue
        notes = []
        if s["state"] == "fatal" and s.get("fatal_reason"):
            notes.append(f"{s['worker']} is fatal: {printable(s['fatal_reason'])} "
                         f"(fix it, then `fairsched restart {s['worker']}`)")
        elif s["restarts"] and s.get("last_exit") and not s.get("recovered"):
            notes.append(f"{s['worker']} last exited: {printable(s['last_exit'])}")
        if s.get("recycling") and s["state"] != "fatal":
            notes.append(f"{s['worker']} is being recycled: {printable(s['recycling'])}")
        if s.get("retiring") == "removed":
            notes.append(f"{s['worker']} is leaving: its group left workers.toml in a reload "
                         "(it stops once its jobs end)")
        elif s.get("retiring") == "replaced":
            notes.append(f"{s['worker']} is being replaced with its group's new settings (a "
                         "reload): it stops once its jobs end")
        if s.get("suspended"):
            notes.append(f"{s['worker']} (pid {s['pid']}) is stopped by a signal (SIGSTOP, "
                         f"Ctrl-Z): it runs nothing until `kill -CONT {s['pid']}`")
        for note in notes:
            lines += wrap(note.split(" "), width, " ")
    return "\n".join(lines) + "\n"


def wrap(words: list[str], width: int | None, sep: str) -> list[str]:
    """`words` joined by `sep` into lines of at most `width` terminal columns (one line when
    None), the lines after the first indented by two spaces: a terminal would cut them
    anywhere, a word or a field of `ps` in two."""
    lines = [words[0]]
    for word in words[1:]:
        if width is not None and display_width(lines[-1] + sep + word) > width:
            lines.append("  " + word)
        else:
            lines[-1] += sep + word
    return lines
