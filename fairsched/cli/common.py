"""What every command shares: the --config option and one-line errors with the README's exit
codes."""

from __future__ import annotations

import errno
import functools
import logging
import math
import os
import re
import sys
import traceback
import unicodedata
from typing import NoReturn

import click

from fairsched.errors import ConfigError, FairschedError, given, path_name
from fairsched.logs import JsonFormatter

config_option = click.option(
    "--config", "config_path", metavar="PATH",
    help="workers.toml (default: $FAIRSCHED_CONFIG or ./workers.toml).")


class UsageProblem(Exception):
    """Bad input on the command line: exit 2."""


# A minus sign is taken for zero's sake: -0 is 0, every other negative number is refused.
_DECIMAL = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def parse_seconds(option: str, text: str | None, *, positive: bool = False,
                  maximum: float | None = None) -> float:
    """A duration given on the command line: finite, >= 0 (> 0 if `positive`, at most
    `maximum`); 0.0 if absent."""
    if text is None:
        return 0.0
    # ASCII digits only, as for integers: float() would also take "1_000", " 1" or other
    # scripts' digits.
    value = float(text) if _DECIMAL.fullmatch(text) else math.nan
    if (not math.isfinite(value) or value < 0 or (positive and value == 0)
            or (maximum is not None and value > maximum)):
        bound = "> 0" if positive else ">= 0"
        if maximum is not None:
            bound = (f"> 0 and at most {maximum:.0f}" if positive
                     else f"from 0 to {maximum:.0f}")
        raise UsageProblem(f"{option} must be a number of seconds {bound}, got {given(text)}")
    return value if value else 0.0  # -0.0 is said as 0


def parse_int(option: str, text: str | None, low: int, high: int | None = None) -> int | None:
    """An integer given on the command line, from `low` to `high`; None if absent."""
    if text is None:
        return None
    # ASCII digits only: int() would also take "1_0", " 1" or other scripts' digits, and a
    # typo could then name another job. A minus sign gives -0 (0) or a number out of bounds.
    value = int(text) if re.fullmatch(r"-?[0-9]{1,20}", text) else None
    if value is None or value < low or (high is not None and value > high):
        bounds = f"from {low} to {high}" if high is not None else f">= {low}"
        raise UsageProblem(f"{option} must be an integer {bounds}, got {given(text)}")
    return value


def parse_job_id(text: str, option: str = "ID") -> int:
    """A queued job's id as every command takes it: plain ASCII digits, 1 to the largest
    bigint; an on-demand job's id (od-4) is refused saying what it is."""
    if re.fullmatch(r"od-[0-9]+", text):
        raise UsageProblem(f"{text} is an on-demand job: it is in no table, and it ends when its"
                           " caller stops waiting (Ctrl-C on `fairsched submit --on-demand`)")
    return parse_int(option, text, 1, 2**63 - 1)


DATABASE_TIMEOUT = "FAIRSCHED_DATABASE_TIMEOUT"
ANSWER_TIMEOUT = 30.0  # seconds a command waits for each answer of the database's, by default


def bound_database_waits() -> None:
    """A command's waits on the database end, with one line naming it: 10 s for a connection,
    30 s for each answer, or FAIRSCHED_DATABASE_TIMEOUT seconds for either."""
    from fairsched.store import database

    text = os.environ.get(DATABASE_TIMEOUT)
    seconds = (parse_seconds(DATABASE_TIMEOUT, text, positive=True, maximum=86400)
               if text else None)
    database.waits = database.Waits(
        connect=seconds, answer=seconds or ANSWER_TIMEOUT,
        hint=f"; {DATABASE_TIMEOUT} sets how long to wait")


_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def printable(text: str) -> str:
    """`text` safe in a terminal table: control characters (a line break, an escape sequence
    that would redraw the screen) and lone surrogates, which no terminal encoding takes,
    spelled out as Python does (\\n, \\x1b, \\ud800)."""
    return _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], text)


def can_redraw(stream) -> bool:
    """Whether `stream` is a terminal that takes cursor movement and erasing (ps --watch,
    on-demand progress): not a pipe or a file, nor a terminal whose TERM is unset or `dumb`
    (an editor's shell buffer, a CI log), where escape codes would show as garbage."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # closed, or no file behind it
        return False
    return tty and os.environ.get("TERM", "") not in ("", "dumb")


def terminal_columns(stream) -> int | None:
    """How many columns wide the terminal `stream` writes to is (`COLUMNS` wins, as for
    other programs); None for a pipe or a file, or a terminal that does not say."""
    try:
        if not stream.isatty():
            return None
        fd = stream.fileno()
    except (AttributeError, ValueError, OSError):
        return None
    columns = os.environ.get("COLUMNS", "")
    if columns.isascii() and columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        return os.get_terminal_size(fd).columns or None
    except OSError:
        return None


def display_width(text: str) -> int:
    """Terminal columns `text` takes: wide and fullwidth characters (CJK, most emoji) two,
    combining marks and zero-width characters none."""
    if text.isascii():
        return len(text)
    return sum(_char_width(ch) for ch in text)


def _char_width(ch: str) -> int:
    if unicodedata.category(ch) in ("Mn", "Me") or ch in "\u200b\u200c\u200d\u2060\ufeff":
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def clip(text: str, columns: int, mark: str = "…") -> str:
    """`text` cut to at most `columns` terminal columns, ending in `mark` if cut. Reads no
    further than the cut: a job's error may be a whole document."""
    if text.isascii() and len(text) <= columns:
        return text
    used, room, cut = 0, columns - display_width(mark), None
    for i, ch in enumerate(text):
        used += _char_width(ch)
        if cut is None and used > room:
            cut = i
        if used > columns:
            return text[:cut] + mark
    return text


def clip_middle(text: str, columns: int, mark: str = "…") -> str:
    """`text` in at most `columns` terminal columns: when it is longer, its start and its
    end with `mark` between them. An error says what failed first ('RuntimeError: ', 'worker
    pdf-1 ...') and why last: the start is kept up to its first ': ' (else to a space), in
    at most two fifths of the room, and the rest goes to the end."""
    if display_width(text) <= columns:
        return text
    room = columns - display_width(mark)
    head_room = room * 2 // 5
    head = clip(text, head_room, mark="")
    name = head.find(": ")
    space = head.rfind(" ")
    if name > 0:
        head = head[:name + 2]
    elif space >= len(head) // 2:
        head = head[:space + 1]
    tail_room, start = room - display_width(head), len(text)
    while start > 0 and tail_room - _char_width(text[start - 1]) >= 0:
        start -= 1
        tail_room -= _char_width(text[start])
    space = text.find(" ", start, start + 12)  # a word cut at its start reads as another word
    if space >= 0:
        start = space + 1
    return head + mark + text[start:]


def pad(text: str, columns: int) -> str:
    """`text` padded with spaces to `columns` terminal columns."""
    return text + " " * (columns - display_width(text))


def duration(seconds: float, *, tenths: bool = False) -> str:
    """A span as `ps` and `jobs` show it: 42s (4.2s with tenths), 3m07s, 5h02m, 2d04h."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s" if tenths else f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    if seconds < 86400:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    return f"{int(seconds // 86400)}d{int(seconds % 86400 // 3600):02d}h"


def fail(message: str, code: int) -> NoReturn:
    if _debugging() and sys.exc_info()[1] is not None:
        traceback.print_exc()
    if any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers):
        logging.getLogger("fairsched").error(message)  # `supervise --log-format json`: JSON too
    else:
        click.echo(f"fairsched: {message}", err=True)
    sys.exit(code)


def require_stdout() -> None:
    """Exit 1 with one line, before any work, when standard output is closed (`>&-`) for a
    command whose output is its point: click would drop the output silently, exit 0."""
    if sys.stdout is None:  # closed when the command started: Python made no stream
        _cannot_write(OSError(errno.EBADF, os.strerror(errno.EBADF)))


def output(text: str, nl: bool = True) -> None:
    """Print `text`, a command's output; standard output that takes none (closed, opened
    read-only, a full disk) is one line naming it, exit 1. A reader gone (BrokenPipeError) is
    left to reports_errors."""
    try:
        if sys.stdout is None:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        click.echo(text, nl=nl)
    except BrokenPipeError:
        raise
    except OSError as exc:
        _cannot_write(exc)


def _cannot_write(exc: OSError) -> NoReturn:
    fail(f"cannot write to standard output: {exc.strerror or exc}", 1)


def print_outcome(line: str, done: str) -> None:
    """Print `line`, the answer of a change already made in the database; when standard
    output takes none (a full disk, closed, a reader gone), exit 1 with `done`, which says
    what was changed, so the user does not do it again."""
    try:
        if sys.stdout is None:  # closed when the command started: Python made no stream
            raise OSError("standard output is closed")
        click.echo(line)
        sys.stdout.flush()
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):  # nothing more will be read from it
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        fail(f"{done}: {exc.strerror or exc}", 1)


def _stdout_gone() -> bool:
    """Whether standard output is a pipe whose reader has closed it."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return True
    except (OSError, ValueError):
        return False
    try:
        import select

        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)  # POLLERR is reported whatever is asked
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _debugging() -> bool:
    """`fairsched --debug ...`: errors show their traceback too."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and (ctx.find_root().obj or {}).get("debug"))


def reports_errors(func):
    """One line and the contract's exit code (2 bad usage or config, 1 failed) instead of a traceback."""
    from fairsched.sched import TraceError

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except (UsageProblem, ConfigError, TraceError) as exc:
            fail(str(exc), 2)
        except FairschedError as exc:  # unknown ids, jobs in the wrong status, no supervisor
            fail(str(exc), 1)
        except ValueError as exc:  # a value the options let through and the library refused
            fail(str(exc), 2)
        except BrokenPipeError as exc:
            if not _stdout_gone():
                fail(f"lost the supervisor's control socket: {exc}", 1)
            # Our reader left (`ps --watch | head`): nothing to say, and no one to say it to.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        except (ConnectionError, TimeoutError) as exc:
            fail(f"lost the supervisor's control socket: {exc}", 1)
        except OSError as exc:  # state_dir not writable, a file where a folder should be, ...
            where = f"{path_name(exc.filename)}: " if exc.filename else ""
            fail(f"{where}{exc.strerror or exc}", 1)
        except RecursionError:
            fail("the input nests too deeply", 2)
        except Exception as exc:
            if not _is_database_error(exc):
                raise
            from fairsched.logs import first_line

            fail(f"database error: {first_line(exc)}", 1)
    return wrapper


def expected_error(exc: BaseException) -> bool:
    """Whether reports_errors turns `exc` into one line (otherwise it is a bug)."""
    from fairsched.sched import TraceError

    return (isinstance(exc, UsageProblem | FairschedError | TraceError | ValueError | OSError
                       | RecursionError)
            or _is_database_error(exc))


def _is_database_error(exc: Exception) -> bool:
    # A command that never imported psycopg cannot have raised one of its errors.
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(exc, psycopg.Error)
