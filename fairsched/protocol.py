"""The pipe protocol between the supervisor and a worker: framing, decoding and message checks.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON, always an
object with a string field "t". docs/protocol.md is the full description.
"""

from __future__ import annotations

import functools
import json
import re
import struct
import sys
from collections.abc import Collection

PROTOCOL_VERSION = 1
MAX_FRAME = 1 << 20  # bytes of JSON in one frame, the 4-byte header not counted
# Bytes of a payload's JSON accepted for a job: compact, in UTF-8 (as payload_json writes it
# and PostgreSQL prints stored jsonb, numbers written out in full). PostgreSQL adds a space
# after each comma and colon, up to half as long again, and the rest of a run frame needs room
# too: half a frame leaves enough.
MAX_PAYLOAD = MAX_FRAME // 2
READ_SIZE = 1 << 18  # bytes either side reads from its pipe at most at once
# Levels of arrays and objects in a payload: far more than any job needs, and well within what
# a worker's JSON decoder takes (Python's gives up near its recursion limit, about 1,000).
MAX_DEPTH = 500

# How a worker's exit status reads when it could not say why on its pipe (sysexits.h's
# numbers). The worker runtime exits with them; the supervisor decodes them (process.py).
EXIT_CANNOT_START = 78  # EX_CONFIG, before its hello: bad handler or environment; not restarted
EXIT_PROTOCOL = 76  # EX_PROTOCOL: the supervisor sent something the worker cannot read
EXIT_SOFTWARE = 70  # EX_SOFTWARE: the worker itself failed (its log says how)

WORKER_MESSAGES = frozenset({"hello", "progress", "result", "error", "refused", "fatal"})
SUPERVISOR_MESSAGES = frozenset({"run", "cancel", "stop"})
MESSAGE_TYPES = WORKER_MESSAGES | SUPERVISOR_MESSAGES

_HEADER = struct.Struct(">I")
_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
_dumps_utf8 = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode


class ProtocolError(ValueError):
    """A frame or message breaks the protocol; the peer that sent it is dropped. From
    FrameDecoder.feed, `before` holds the whole messages that came ahead of the bad frame: they
    were sent in good order, and count (a result written just before a stray frame, in one
    write or in two, is the same result)."""

    before: list[dict] | tuple = ()


class IncompatibleProtocol(ProtocolError):
    """A hello in another version of the protocol: no restart can make the two sides agree."""


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


_decoder = json.JSONDecoder(parse_constant=_reject_constant)
_loads = _decoder.decode
_scan_once = _decoder.scan_once  # what decode does less its checks for spaces either side


def _loads_frame(text: str):
    """_loads for a frame body: the common case, nothing around the object, twice as fast."""
    try:
        value, end = _scan_once(text, 0)
    except StopIteration:
        end = -1
    return value if end == len(text) else _loads(text)  # _loads says what is wrong, if anything


def encode(msg: dict) -> bytes:
    """One frame for `msg`, non-ASCII text in UTF-8 (escaped only for a lone surrogate, which
    UTF-8 cannot carry); raises TypeError/ValueError for what JSON cannot hold and
    ProtocolError when the frame would exceed MAX_FRAME."""
    return _frame(_json_bytes(msg))


def _json_bytes(value) -> bytes:
    """Compact JSON in UTF-8; escaped ASCII only when `value` holds a lone surrogate."""
    try:
        return _dumps_utf8(value).encode()
    except UnicodeEncodeError:
        return _dumps(value).encode("ascii")


def payload_json(value) -> tuple[str, int]:
    """`value` as the JSON text a run frame carries, and its bytes there: non-ASCII characters
    as they are, in UTF-8 (an escape takes 6 or 12 bytes for UTF-8's 2 to 4), escaped only
    when `value` holds a lone surrogate, which UTF-8 cannot. TypeError/ValueError for what
    JSON cannot hold."""
    data = _json_bytes(value)
    return data.decode(), len(data)


def encode_run(incarnation: str, slot: int, job_id: int | str, job_type: str, priority: int,
               attempt: int, on_demand: bool, payload_json: str, claim: int = 0) -> bytes:
    """The "run" frame, its payload given as JSON text (jsonb as PostgreSQL prints it, or
    payload_json of an on-demand payload): spliced in as it is, never parsed and encoded again
    on its way through the supervisor. `claim`, a queued job's claim number (its row's
    `claims`), goes in the job object when not 0: job.transaction() fences its commit on it."""
    if len(payload_json) > 2 * MAX_DEPTH and json_depth(payload_json) > MAX_DEPTH:
        raise ProtocolError(f"payload nests deeper than {MAX_DEPTH} levels")
    if _INT_DIGITS and len(payload_json) > _INT_DIGITS:
        _check_integers(payload_json)
    # Written out rather than encoded from a dict: one is sent for every job, and this takes
    # a third of the time. The strings that repeat (a worker's incarnation, the job types)
    # are encoded once.
    job_id_json = f"{job_id:d}" if type(job_id) is int else _dumps(job_id)
    return _frame(f'{{"t":"run","incarnation":{_json_name(incarnation)},"slot":{slot:d},'
                  f'"job":{{"id":{job_id_json},"type":{_json_name(job_type)},'
                  f'"priority":{priority:d},"attempt":{attempt:d},'
                  f'"on_demand":{"true" if on_demand else "false"},'
                  f'{f""""claim":{claim:d},""" if claim else ""}'
                  f'"payload":{payload_json}}}}}'.encode())


# Digits of an integer a Python worker's JSON decoder reads (int()'s limit, 4300 unless
# PYTHONINTMAXSTRDIGITS says otherwise; 0 for no limit). jsonb keeps numbers of any length
# and prints them out in full: '1e5000', stored by hand, reaches a worker as 5001 digits.
_INT_DIGITS = sys.get_int_max_str_digits()
# Every digit as "0": a run of more digits than that is then a plain substring search away
# (a regular expression for it takes a scan per digit, 30 times as long).
_DIGITS_AS_ZERO = str.maketrans("0123456789", "0" * 10)
_LONG_DIGITS = "0" * (_INT_DIGITS + 1)
_STRING_OR_NUMBER = re.compile(r'"(?:[^"\\]|\\.)*"|-?([0-9]+)([.eE][-+.eE0-9]*)?')


def _check_integers(payload_json: str) -> None:
    """ProtocolError for an integer in `payload_json` too long for a worker to read. Digits
    in a string are no number, and a number with a fraction or an exponent is read by
    float(), which takes any length."""
    if _LONG_DIGITS not in payload_json.translate(_DIGITS_AS_ZERO):
        return  # the usual case: no run of digits that long anywhere
    for match in _STRING_OR_NUMBER.finditer(payload_json):
        digits, rest = match.groups()
        if digits is not None and rest is None and len(digits) > _INT_DIGITS:
            raise ProtocolError(f"payload holds a number of {len(digits)} digits, past the "
                                f"{_INT_DIGITS} a worker's JSON decoder reads")


@functools.lru_cache(maxsize=4096)
def _json_name(text: str) -> str:
    """A string that recurs in frames (an incarnation, a job type), as JSON."""
    return _dumps(text)


def json_depth(text: str) -> int:
    """How deep arrays and objects nest in JSON `text`: exact past MAX_DEPTH; below it, an
    upper bound (the number of brackets, counted in two quick scans)."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return min(MAX_DEPTH, text.count("[") + text.count("{"))  # an upper bound is enough
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "[" or ch == "{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == "]" or ch == "}":
            depth -= 1
    return deepest


def _frame(body: bytes) -> bytes:
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(body)} bytes exceeds the {MAX_FRAME}-byte limit")
    return _HEADER.pack(len(body)) + body


def decode_body(body: bytes | bytearray, accept: Collection[str] = MESSAGE_TYPES) -> dict:
    """The message in one frame body (without its length header)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"frame is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        msg = _loads_frame(text)
    except RecursionError:
        raise ProtocolError("frame JSON nests too deeply") from None
    except ValueError as exc:  # json.JSONDecodeError, NaN, over-long integers
        raise ProtocolError(f"frame is not valid JSON: {exc}") from None
    if not isinstance(msg, dict):
        raise ProtocolError(f"frame holds a JSON {_json_kind(msg)}, not an object")
    kind = msg.get("t")
    if not isinstance(kind, str):
        raise ProtocolError("frame has no string field 't' (the message type)")
    if kind not in accept:
        raise ProtocolError(f"unknown message type {kind[:40]!r}")
    return msg


class FrameDecoder:
    """Turns a byte stream into messages, however the stream was cut into reads.

    `accept` limits the message types this side takes (default: any known type). After a
    ProtocolError the stream cannot be trusted: every later feed raises the same error.
    """

    __slots__ = ("_buf", "_accept", "_error")

    def __init__(self, accept: Collection[str] | None = None):
        self._buf = bytearray()
        self._accept = MESSAGE_TYPES if accept is None else frozenset(accept)
        self._error: ProtocolError | None = None

    @property
    def pending(self) -> int:
        """Bytes received but not yet part of a whole frame."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[dict]:
        """The whole messages `data` completes; `data` is copied, so its buffer may be reused."""
        if self._error is not None:
            raise self._error
        buf = self._buf
        buf += data
        out = []
        pos = 0
        end = len(buf)
        try:
            while end - pos >= 4:
                (size,) = _HEADER.unpack_from(buf, pos)
                # Checked before the body arrives: an oversize length is refused at once.
                if size == 0:
                    raise ProtocolError("frame of length 0")
                if size > MAX_FRAME:
                    raise ProtocolError(f"frame of {size} bytes exceeds the {MAX_FRAME}-byte limit")
                start = pos + 4
                if end - start < size:
                    break
                pos = start + size
                out.append(decode_body(buf[start:pos], self._accept))
        except ProtocolError as exc:
            self._error = exc
            buf.clear()
            exc.before = out
            raise
        if pos:
            del buf[:pos]
        return out


def _json_kind(value) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return "number"


# -- message checks -----------------------------------------------------------------------------

def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(ok: bool, kind: str, field: str, want: str, msg: dict) -> None:
    if not ok:
        key = field.rpartition(".")[2]  # "job.id" is looked up as "id" in the job object
        if key in msg:
            got = f"got {_json_kind(msg[key])} {json.dumps(msg[key])[:40]}"
        else:
            got = "it is missing"
        raise ProtocolError(f"{kind!r} message: field {field!r} must be {want}, {got}")


def _job_id_ok(value) -> bool:
    return _is_int(value) or isinstance(value, str)


def _slot_and_job(kind: str, msg: dict) -> None:
    slot, job_id = msg.get("slot"), msg.get("job_id")
    if type(slot) is int and slot >= 0 and (type(job_id) is int or type(job_id) is str):
        return  # the way nearly every message is: checked without a call per field
    _check(_is_int(slot) and slot >= 0, kind, "slot", "an integer >= 0", msg)
    _check(_job_id_ok(msg.get("job_id")), kind, "job_id", "an integer or a string", msg)


def _v_hello(msg: dict) -> None:
    _check(_is_int(msg.get("protocol")), "hello", "protocol", "an integer", msg)
    if msg["protocol"] != PROTOCOL_VERSION:
        raise IncompatibleProtocol(f"worker speaks protocol {msg['protocol']}, "
                                   f"the supervisor speaks {PROTOCOL_VERSION}")
    pid = msg.get("pid")
    _check(_is_int(pid) and pid > 0, "hello", "pid", "a positive integer", msg)
    _check(isinstance(msg.get("incarnation"), str), "hello", "incarnation", "a string", msg)
    slots = msg.get("slots")
    _check(_is_int(slots) and slots >= 1, "hello", "slots", "an integer >= 1", msg)
    types = msg.get("types")
    _check(isinstance(types, list) and bool(types) and all(isinstance(t, str) for t in types),
           "hello", "types", "a non-empty array of strings", msg)


def _v_progress(msg: dict) -> None:
    # Its fraction and message only show in `ps`: the supervisor tidies them up, and takes a
    # wrong one for no progress rather than for a broken worker.
    _slot_and_job("progress", msg)


def _v_result(msg: dict) -> None:
    _slot_and_job("result", msg)
    if "result" not in msg:
        _check(False, "result", "result", "present (any JSON value)", msg)


def _v_error(msg: dict) -> None:
    _slot_and_job("error", msg)
    _check(isinstance(msg.get("error"), str), "error", "error", "a string", msg)
    _check(isinstance(msg.get("permanent"), bool), "error", "permanent", "a boolean", msg)


def _v_refused(msg: dict) -> None:
    _slot_and_job("refused", msg)
    _check(isinstance(msg.get("reason"), str), "refused", "reason", "a string", msg)


def _v_fatal(msg: dict) -> None:
    _check(isinstance(msg.get("error"), str), "fatal", "error", "a string", msg)


def _v_run(msg: dict) -> None:
    slot, job = msg.get("slot"), msg.get("job")
    if (type(msg.get("incarnation")) is str and type(slot) is int and slot >= 0
            and type(job) is dict and type(job.get("type")) is str and "payload" in job
            and type(job.get("priority")) is int and type(job.get("on_demand")) is bool):
        job_id, attempt = job.get("id"), job.get("attempt")
        claim = job.get("claim", 1)
        if ((type(job_id) is int or type(job_id) is str) and type(attempt) is int and attempt >= 1
                and type(claim) is int and claim >= 1):
            return  # as every frame of a supervisor's is: checked without a call per field
    _check(isinstance(msg.get("incarnation"), str), "run", "incarnation", "a string", msg)
    slot = msg.get("slot")
    _check(_is_int(slot) and slot >= 0, "run", "slot", "an integer >= 0", msg)
    job = msg.get("job")
    _check(isinstance(job, dict), "run", "job", "an object", msg)
    _check(_job_id_ok(job.get("id")), "run", "job.id", "an integer or a string", job)
    _check(isinstance(job.get("type"), str), "run", "job.type", "a string", job)
    _check("payload" in job, "run", "job.payload", "present (any JSON value)", job)
    _check(_is_int(job.get("priority")), "run", "job.priority", "an integer", job)
    attempt = job.get("attempt")
    _check(_is_int(attempt) and attempt >= 1, "run", "job.attempt", "an integer >= 1", job)
    _check(isinstance(job.get("on_demand"), bool), "run", "job.on_demand", "a boolean", job)
    claim = job.get("claim", 1)
    _check(_is_int(claim) and claim >= 1, "run", "job.claim", "an integer >= 1 when present", job)


def _v_cancel(msg: dict) -> None:
    _check(isinstance(msg.get("incarnation"), str), "cancel", "incarnation", "a string", msg)
    _slot_and_job("cancel", msg)


def _v_stop(msg: dict) -> None:
    pass


_VALIDATORS = {
    "hello": _v_hello, "progress": _v_progress, "result": _v_result, "error": _v_error,
    "refused": _v_refused, "fatal": _v_fatal, "run": _v_run, "cancel": _v_cancel, "stop": _v_stop,
}


def validate(msg: dict) -> dict:
    """Check the required fields of a decoded message; returns it, or raises ProtocolError."""
    if not isinstance(msg, dict):
        raise ProtocolError(f"message is a {type(msg).__name__}, not an object")
    kind = msg.get("t")
    check = _VALIDATORS.get(kind) if isinstance(kind, str) else None
    if check is None:
        raise ProtocolError(f"unknown message type {kind!r}")
    check(msg)
    return msg
