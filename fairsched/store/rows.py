"""Rows of the job table as Python sees them: a new job's description checked field by field,
JSON and text made into what PostgreSQL's jsonb and text columns store (NUL, lone surrogates,
long numbers), and the pending and claimed jobs the supervisor's fetch and claim read."""

from __future__ import annotations

import decimal
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fairsched.protocol import MAX_DEPTH, MAX_PAYLOAD, json_depth, payload_json
from fairsched.store.schema import MAX_DELAY, MAX_PRIORITY
from fairsched.type_names import check_tenant_name, check_type_name

JOB_FIELDS = frozenset({"type", "payload", "priority", "max_attempts", "delay", "key", "tenant"})
INT4_MAX = 2**31 - 1
INT8_MAX = 2**63 - 1
MAX_KEY = 1000  # bytes of an idempotency key


@dataclass(frozen=True, slots=True)
class Candidate:
    """A pending job as fetch returns it: what its score needs, without its payload."""

    id: int
    type: str
    priority: int
    eligible_at: float  # epoch seconds: created, or its retry's run_after
    # The tenant (None: the default one) and its recent usage in slot-seconds, decayed to the
    # fetch: what the tenant term of the score needs. Keyword-only, so that QueuedJob's own
    # fields keep their places.
    tenant: str | None = field(default=None, kw_only=True)
    usage: float = field(default=0.0, kw_only=True)


@dataclass(frozen=True, slots=True)
class QueuedJob(Candidate):
    """A job just claimed: a candidate's fields, its payload and attempts (this one counted)."""

    payload_json: str | None  # the payload's JSON text as stored; None for SQL NULL
    attempts: int
    max_attempts: int | None
    claim: int  # this claim's number: what its outcome is fenced on


def job_row(job: Mapping[str, Any], index: int = 0, several: bool = False) -> tuple:
    """Validate one job description; return (type, priority, payload_json, max_attempts, delay,
    key, tenant). Every error names the job by its `index` when it is one of `several`."""
    try:
        return _job_row(job, index)
    except ValueError as exc:
        message = str(exc)
        if not several or message.startswith(f"job {index}: "):
            raise
        raise ValueError(f"job {index}: {message}") from None


def _job_row(job: Mapping[str, Any], index: int) -> tuple:
    if not isinstance(job, Mapping):
        raise ValueError(f"job {index}: expected a mapping of job fields, got {kind_of(job)}")
    unknown = set(job) - JOB_FIELDS
    if unknown:
        raise ValueError(f"job {index}: unknown field {sorted(unknown)[0]!r}"
                         f" (known: {', '.join(sorted(JOB_FIELDS))})")
    if "type" not in job:
        raise ValueError(f"job {index}: 'type' is required")
    type_ = job["type"]
    check_type_name(type_)
    priority = job.get("priority", 0)
    if not is_int(priority) or not 0 <= priority <= MAX_PRIORITY:
        raise ValueError(f"priority must be an integer from 0 to {MAX_PRIORITY}, got {priority!r}")
    max_attempts = job.get("max_attempts")
    if max_attempts is not None and (not is_int(max_attempts)
                                     or not 1 <= max_attempts <= INT4_MAX):
        raise ValueError(f"max_attempts must be an integer from 1 to {INT4_MAX},"
                         f" got {max_attempts!r}")
    delay = job.get("delay", 0.0)
    # Compared, not math.isfinite(): an int too large for a float would raise OverflowError.
    # NaN fails the comparison too.
    if (not isinstance(delay, int | float) or isinstance(delay, bool)
            or not 0 <= delay <= MAX_DELAY):
        raise ValueError(f"delay must be a number of seconds from 0 to {MAX_DELAY:.0f},"
                         f" got {delay!r}")
    key = job.get("key")
    if key is not None and not is_text(key):
        raise ValueError(f"key must be non-empty text (UTF-8, no NUL), got {key!r}")
    if key is not None and len(key.encode()) > MAX_KEY:  # the unique index takes no more
        raise ValueError(f"key is {len(key.encode())} bytes; at most {MAX_KEY}")
    tenant = job.get("tenant")
    if tenant is not None:
        check_tenant_name(tenant)
    payload = encode_json(job.get("payload"), "payload")
    size = stored_size(payload, job.get("payload"))
    if size > MAX_PAYLOAD:
        grown = number_growth(payload)
        how = (f" once its numbers are written out in full, as PostgreSQL stores them"
               f" ({size - grown} as compact JSON)" if grown > 0 else "")
        raise ValueError(f"payload is {size} bytes of JSON{how}; at most {MAX_PAYLOAD} fit in"
                         " the frame that takes a job to its worker (pass a path or a URL instead)")
    if payload is not None and json_depth(payload) > MAX_DEPTH:
        raise ValueError(f"payload nests deeper than {MAX_DEPTH} levels")
    return (type_, priority, payload, max_attempts, float(delay), key, tenant)


# A \u0000 escape in JSON text: one not itself escaped, after an even run of backslashes.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def encode_json(value: Any, what: str) -> str | None:
    """JSON text PostgreSQL's jsonb accepts, or None for SQL NULL."""
    if value is None:
        return None
    text = _json_text(value, what)
    problem = _refused_by_jsonb(text, value)
    if problem is not None:
        raise ValueError(f"{what} contains {problem}, which PostgreSQL jsonb cannot store")
    return text


# The one key of the object a result is stored as when jsonb cannot hold it as it is: its
# value is the result's JSON text, a string jsonb takes whatever the result holds.
RESULT_AS_TEXT = "fairsched:json"


def encode_result(value: Any) -> str | None:
    """A handler's result as the result column stores it (None for SQL NULL): as it is, which
    jsonb queries see, or, when jsonb would refuse it (a NUL character, a lone surrogate) or
    give it back changed (a float with a positive exponent comes back an integer, -0.0 as 0),
    as {RESULT_AS_TEXT: its JSON text}; so is a result that looks like that object itself.
    decode_result gives back the result. ValueError for what is no JSON (NaN)."""
    if value is None:
        return None
    text = _json_text(value, "result")
    if (_refused_by_jsonb(text, value) is None and not _changed_by_jsonb(text)
            and not (type(value) is dict and len(value) == 1 and RESULT_AS_TEXT in value)):
        return text
    inner, _ = payload_json(value)  # UTF-8, where a lone surrogate leaves it escaped
    return json.dumps({RESULT_AS_TEXT: inner}, separators=(",", ":"))


def decode_result(value: Any) -> Any:
    """A result as the handler returned it, from the decoded result column (encode_result)."""
    if type(value) is dict and len(value) == 1 and type(value.get(RESULT_AS_TEXT)) is str:
        return json.loads(value[RESULT_AS_TEXT])
    return value


def _json_text(value: Any, what: str) -> str:
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))
    except RecursionError:
        raise ValueError(f"{what} nests too deeply to be JSON") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not JSON-serialisable: {exc}") from None


def _refused_by_jsonb(text: str, value: Any) -> str | None:
    """What in `value` (its JSON `text`, all ASCII) jsonb refuses, or None."""
    if "\\u0000" in text and _NUL_ESCAPE.search(text):  # not a backslash before "u0000"
        return "a NUL character"
    if "\\ud" in text or "\\uD" in text:  # surrogates: jsonb takes them only in valid pairs
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return "a lone surrogate (a broken UTF-16 pair)"
    return None


def _changed_by_jsonb(text: str) -> bool:
    """Whether a number in JSON `text` (as json.dumps writes it) comes back from jsonb as
    another: jsonb keeps numbers as numeric, written out in full, so 1e+23 comes back the
    integer 100000000000000000000000 and -0.0 comes back 0.0."""
    if "e+" not in text and "-0.0" not in text:
        return False
    changed = False

    def number(token: str) -> float:
        nonlocal changed
        if "e+" in token or (token.startswith("-") and float(token) == 0):
            changed = True
        return 0.0

    json.loads(text, parse_float=number)
    return changed


def stored_size(text: str | None, value: Any) -> int:
    """Bytes of `value`'s JSON `text` (as encode_json writes it) as PostgreSQL prints it back
    into a run frame, spaces aside: UTF-8, where the text escapes every non-ASCII character."""
    if text is None:
        return 0
    size = len(text)
    if "\\u" in text:  # maybe an escaped non-ASCII character: 6 or 12 bytes here, 2 to 4 there
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
    return size + number_growth(text)


_EXPONENT = re.compile(r"[0-9][eE]")


def number_growth(text: str) -> int:
    """How many bytes longer the numbers in JSON `text` print once jsonb has stored them:
    as numeric, written out in full (1e+308 comes back as 309 digits)."""
    if not _EXPONENT.search(text):  # only a number with an exponent grows
        return 0
    grown = 0

    def number(token: str) -> float:
        nonlocal grown
        if "e" in token or "E" in token:
            grown += len(format(decimal.Decimal(token), "f")) - len(token)
        return 0.0

    try:
        json.loads(text, parse_float=number)
    except RecursionError:
        return 0  # too deep for a payload anyway: refused as such
    return grown


def storable_text(text: str) -> str:
    """`text` as a PostgreSQL text column takes it: NUL and lone surrogates spelled out."""
    if "\x00" in text:
        text = text.replace("\x00", "\\0")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def is_text(value: Any) -> bool:
    """A non-empty string a PostgreSQL text column takes as it is (no NUL, valid UTF-8)."""
    if not isinstance(value, str) or not value or "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, e.g. from an argument that was not UTF-8
        return False
    return True


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def kind_of(value: Any) -> str:
    return type(value).__name__
