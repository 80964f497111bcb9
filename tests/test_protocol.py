"""Framing, decoding and message checks of the pipe protocol."""

from __future__ import annotations

import json
import os
import re
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairsched.protocol import (
    EXIT_CANNOT_START,
    EXIT_PROTOCOL,
    EXIT_SOFTWARE,
    MAX_DEPTH,
    MAX_FRAME,
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    SUPERVISOR_MESSAGES,
    FrameDecoder,
    ProtocolError,
    encode,
    encode_run,
    json_depth,
    payload_json,
    validate,
)

HELLO = {"t": "hello", "protocol": 1, "pid": 10, "incarnation": "pdf-1.1.ab", "slots": 2,
         "types": ["pdf", "excel"]}
RUN = {"t": "run", "incarnation": "pdf-1.1.ab", "slot": 0,
       "job": {"id": 5, "type": "pdf", "payload": {"path": "/a.pdf"}, "priority": 3,
               "attempt": 1, "on_demand": False}}
MESSAGES = [
    HELLO,
    RUN,
    {"t": "progress", "slot": 1, "job_id": "od-7", "fraction": 0.5, "message": "page 1/2"},
    {"t": "progress", "slot": 0, "job_id": 3, "fraction": None, "message": ""},
    {"t": "result", "slot": 0, "job_id": 5, "result": {"pages": 3, "text": "é😀"}},
    {"t": "result", "slot": 0, "job_id": 5, "result": None},
    {"t": "error", "slot": 0, "job_id": 5, "error": "RuntimeError: x", "permanent": False},
    {"t": "refused", "slot": 4, "job_id": 5, "reason": "slot 4 is out of range"},
    {"t": "fatal", "error": "cannot import handler"},
    {"t": "cancel", "incarnation": "pdf-1.1.ab", "slot": 0, "job_id": 5},
    {"t": "stop"},
]


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def test_constants():
    assert MAX_FRAME == 1 << 20 and PROTOCOL_VERSION == 1


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: m["t"])
def test_round_trip_and_validate(msg):
    data = encode(msg)
    assert struct.unpack(">I", data[:4])[0] == len(data) - 4
    assert FrameDecoder().feed(data) == [msg]
    assert validate(msg) is msg


def test_frames_split_byte_by_byte_and_merged_in_one_read():
    stream = b"".join(encode(m) for m in MESSAGES)
    decoder = FrameDecoder()
    out = []
    for i in range(len(stream)):
        out.extend(decoder.feed(stream[i:i + 1]))
    assert out == MESSAGES and decoder.pending == 0
    assert FrameDecoder().feed(stream) == MESSAGES
    decoder = FrameDecoder()
    assert decoder.feed(stream[:-3]) == MESSAGES[:-1] and decoder.pending > 0
    assert decoder.feed(stream[-3:]) == MESSAGES[-1:]


def test_encoding_is_compact_utf8_json():
    assert encode({"t": "stop"}) == b"\x00\x00\x00\x0c" + b'{"t":"stop"}'
    # Non-ASCII text in UTF-8: 400 KB of "é" fits a frame its escapes (1.2 MB) would not.
    frame = encode({"t": "fatal", "error": "é" * 200_000})
    assert len(frame) < 400_100 and FrameDecoder().feed(frame)[0]["error"] == "é" * 200_000
    body = encode({"t": "fatal", "error": "é\ud800"})[4:]
    assert body.isascii()  # lone surrogates survive: escaped, never invalid UTF-8
    assert FrameDecoder().feed(encode({"t": "fatal", "error": "é\ud800"}))[0]["error"] == "é\ud800"


def test_a_frame_of_exactly_the_limit_passes_and_one_byte_more_fails():
    head = b'{"t":"fatal","error":"'
    body = head + b"x" * (MAX_FRAME - len(head) - 2) + b'"}'
    assert len(body) == MAX_FRAME
    assert FrameDecoder().feed(frame(body))[0]["t"] == "fatal"
    with pytest.raises(ProtocolError, match="frame of 1048577 bytes exceeds the 1048576-byte limit"):
        FrameDecoder().feed(struct.pack(">I", MAX_FRAME + 1))


@pytest.mark.parametrize("payload_json", [
    '{"path": "/a.pdf", "pages": [1, 2]}',  # jsonb as PostgreSQL prints it: spaces
    '{"name": "é😀"}',  # UTF-8 as stored, not escaped
    "null",
    payload_json({"path": "/a.pdf", "text": "é\ud800"})[0],  # on demand, a lone surrogate
])
def test_a_run_frame_carries_its_payload_text_as_it_is(payload_json):
    data = encode_run("pdf-1.1.ab", 2, 5, "pdf", 3, 1, False, payload_json)
    (msg,) = FrameDecoder().feed(data)
    assert validate(msg) == {"t": "run", "incarnation": "pdf-1.1.ab", "slot": 2,
                             "job": {"id": 5, "type": "pdf", "priority": 3, "attempt": 1,
                                     "on_demand": False, "payload": json.loads(payload_json)}}
    assert payload_json.encode() in data


def test_a_queued_jobs_run_frame_carries_its_claim_and_a_bad_one_is_named():
    (msg,) = FrameDecoder().feed(encode_run("i", 0, 5, "pdf", 0, 2, False, "null", 7))
    assert validate(msg)["job"] == {"id": 5, "type": "pdf", "priority": 0, "attempt": 2,
                                    "on_demand": False, "claim": 7, "payload": None}
    (msg,) = FrameDecoder().feed(encode_run("i", 0, "od-1", "pdf", 0, 1, True, "null"))
    assert "claim" not in validate(msg)["job"]  # an on-demand job has none
    for bad, got in ((0, "got number 0"), (True, "got boolean true"), ("7", 'got string "7"')):
        msg["job"]["claim"] = bad
        with pytest.raises(ProtocolError) as caught:
            validate(msg)
        assert str(caught.value) == ("'run' message: field 'job.claim' must be an integer >= 1 "
                                     f"when present, {got}")


def test_a_run_frame_too_large_is_refused():
    with pytest.raises(ProtocolError, match="exceeds the 1048576-byte limit"):
        encode_run("i", 0, 1, "pdf", 0, 1, False, payload_json("x" * MAX_FRAME)[0])


def test_a_run_frame_of_a_payload_too_deep_for_a_worker_is_refused():
    at_limit = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    (msg,) = FrameDecoder().feed(encode_run("i", 0, 1, "pdf", 0, 1, False, at_limit))
    assert msg["job"]["payload"] == json.loads(at_limit)
    with pytest.raises(ProtocolError, match=f"payload nests deeper than {MAX_DEPTH} levels"):
        encode_run("i", 0, 1, "pdf", 0, 1, False, "[" + at_limit + "]")


def _depth(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab', max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(alphabet='[]{}"\\ab', max_size=4), inner, max_size=3),
    max_leaves=30)


@given(json_values, st.integers(0, 3))
def test_json_depth_is_exact_past_the_limit_and_a_bound_below(value, wrap):
    # Wrapped to a depth past MAX_DEPTH, the count is exact; brackets in strings never count.
    deep = value
    for _ in range(MAX_DEPTH + wrap):
        deep = [deep]
    assert json_depth(json.dumps(deep)) == _depth(deep)
    assert json_depth(json.dumps(value)) >= _depth(value)


def test_encode_refuses_oversize_and_unserialisable_messages():
    with pytest.raises(ProtocolError, match="exceeds the 1048576-byte limit"):
        encode({"t": "result", "slot": 0, "job_id": 1, "result": "x" * MAX_FRAME})
    with pytest.raises(TypeError, match="not JSON serializable"):
        encode({"t": "result", "slot": 0, "job_id": 1, "result": {1, 2}})
    with pytest.raises(ValueError, match="not JSON compliant"):
        encode({"t": "result", "slot": 0, "job_id": 1, "result": float("nan")})


@pytest.mark.parametrize(("data", "message"), [
    (struct.pack(">I", 0), "frame of length 0"),
    (struct.pack(">I", 5_000_000), "frame of 5000000 bytes exceeds the 1048576-byte limit"),
    (frame(b"\xff\xfe{}"), "frame is not valid UTF-8 (invalid start byte at byte 0)"),
    (frame(b'{"t": "stop"'), "frame is not valid JSON: Expecting ',' delimiter"),
    (frame(b'{"t": NaN}'), "frame is not valid JSON: NaN is not valid JSON"),
    (frame(b"[1, 2]"), "frame holds a JSON array, not an object"),
    (frame(b'"stop"'), "frame holds a JSON string, not an object"),
    (frame(b'{"type": "stop"}'), "frame has no string field 't' (the message type)"),
    (frame(b'{"t": 7}'), "frame has no string field 't' (the message type)"),
    (frame(b'{"t": "reboot"}'), "unknown message type 'reboot'"),
    (frame(b"[" * 100_000 + b"]" * 100_000), "frame JSON nests too deeply"),
    (frame(b'{"t": "stop", "n": ' + b"9" * 5000 + b"}"), "frame is not valid JSON: Exceeds"),
])
def test_each_protocol_error_names_the_problem(data, message):
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError) as info:
        decoder.feed(data)
    assert str(info.value).startswith(message)
    with pytest.raises(ProtocolError):  # the stream stays condemned
        decoder.feed(encode({"t": "stop"}))


def test_oversize_length_is_refused_before_the_body_arrives():
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError, match="exceeds"):
        decoder.feed(struct.pack(">I", MAX_FRAME + 1) + b"{")


def test_decoder_can_accept_one_direction_only():
    decoder = FrameDecoder(SUPERVISOR_MESSAGES)
    assert decoder.feed(encode(RUN)) == [RUN]
    with pytest.raises(ProtocolError, match="unknown message type 'hello'"):
        decoder.feed(encode(HELLO))


def _with(msg: dict, **changes) -> dict:
    out = dict(msg)
    for key, value in changes.items():
        if value is _DROP:
            out.pop(key)
        else:
            out[key] = value
    return out


_DROP = object()


@pytest.mark.parametrize(("msg", "message"), [
    (_with(HELLO, protocol=2), "worker speaks protocol 2, the supervisor speaks 1"),
    (_with(HELLO, pid=_DROP), "'hello' message: field 'pid' must be a positive integer, it is missing"),
    (_with(HELLO, slots=0), "'hello' message: field 'slots' must be an integer >= 1, got number 0"),
    (_with(HELLO, slots=True), "field 'slots' must be an integer >= 1, got boolean true"),
    (_with(HELLO, types=[]), "field 'types' must be a non-empty array of strings, got array []"),
    (_with(HELLO, types=["a", 1]), "field 'types' must be a non-empty array of strings"),
    ({"t": "progress", "slot": -1, "job_id": 1, "fraction": None},
     "field 'slot' must be an integer >= 0, got number -1"),
    ({"t": "result", "slot": 0, "job_id": [1]},
     "'result' message: field 'job_id' must be an integer or a string, got array [1]"),
    ({"t": "result", "slot": 0, "job_id": 1}, "field 'result' must be present (any JSON value)"),
    ({"t": "error", "slot": 0, "job_id": 1, "error": "x"},
     "'error' message: field 'permanent' must be a boolean, it is missing"),
    ({"t": "refused", "slot": 0, "job_id": 1}, "field 'reason' must be a string"),
    ({"t": "fatal"}, "'fatal' message: field 'error' must be a string"),
    (_with(RUN, job=[]), "'run' message: field 'job' must be an object, got array []"),
    (_with(RUN, job=_with(RUN["job"], id=1.5)),
     "'run' message: field 'job.id' must be an integer or a string, got number 1.5"),
    (_with(RUN, job=_with(RUN["job"], attempt=0)), "field 'job.attempt' must be an integer >= 1"),
    (_with(RUN, job=_with(RUN["job"], payload=_DROP)), "field 'job.payload' must be present"),
    (_with(RUN, job=_with(RUN["job"], on_demand=1)), "field 'job.on_demand' must be a boolean"),
    ({"t": "cancel", "slot": 0, "job_id": 1}, "'cancel' message: field 'incarnation' must be"),
    ({"t": "nope"}, "unknown message type 'nope'"),
    ([], "message is a list, not an object"),
])
def test_validate_names_the_field(msg, message):
    with pytest.raises(ProtocolError) as info:
        validate(msg)
    assert message in str(info.value)


def _valid_dicts(out: list) -> bool:
    return all(isinstance(m, dict) and m.get("t") in MESSAGE_TYPES for m in out)


def _feed_all(data: bytes, cuts: list[int]) -> None:
    decoder = FrameDecoder()
    positions = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    try:
        for a, b in zip(positions, positions[1:], strict=False):
            assert _valid_dicts(decoder.feed(data[a:b]))
    except ProtocolError:
        return


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2000), st.lists(st.integers(min_value=0, max_value=4000), max_size=20))
def test_fuzz_random_bytes_give_messages_or_protocol_error(data, cuts):
    _feed_all(data, cuts)


_json = st.recursive(
    st.none() | st.booleans() | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)  # JSON has neither
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=10)
_piece = st.one_of(
    st.sampled_from(MESSAGES).map(encode),
    st.builds(lambda t, extra: encode({"t": t, "x": extra}), st.sampled_from(sorted(MESSAGE_TYPES)),
              _json),
    _json.map(lambda v: frame(__import__("json").dumps(v).encode())),
    st.binary(min_size=1, max_size=40).map(frame),
    st.binary(max_size=12),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_piece, max_size=8), st.lists(st.integers(min_value=0, max_value=2000), max_size=20))
def test_fuzz_frames_mixed_with_garbage_give_messages_or_protocol_error(pieces, cuts):
    _feed_all(b"".join(pieces), cuts)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(MESSAGES), max_size=10),
       st.lists(st.integers(min_value=0, max_value=5000), max_size=30))
def test_fuzz_any_chunking_of_valid_frames_gives_the_same_messages(msgs, cuts):
    data = b"".join(encode(m) for m in msgs)
    positions = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    decoder = FrameDecoder()
    out = []
    for a, b in zip(positions, positions[1:], strict=False):
        out.extend(decoder.feed(data[a:b]))
    assert out == msgs and decoder.pending == 0


_names = st.text(max_size=12)  # any text: quotes, backslashes, control and non-ASCII characters


@settings(max_examples=300, deadline=None)
@given(_names, st.integers(min_value=0, max_value=10**6),
       st.one_of(st.integers(min_value=1, max_value=2**70), _names), _names,
       st.integers(min_value=0, max_value=10), st.integers(min_value=1, max_value=100),
       st.booleans(), _json)
def test_a_run_frame_decodes_to_the_message_its_fields_make(incarnation, slot, job_id, job_type,
                                                            priority, attempt, on_demand,
                                                            payload):
    data = encode_run(incarnation, slot, job_id, job_type, priority, attempt, on_demand,
                      payload_json(payload)[0])
    (msg,) = FrameDecoder(SUPERVISOR_MESSAGES).feed(data)
    assert validate(msg) == {"t": "run", "incarnation": incarnation, "slot": slot,
                             "job": {"id": job_id, "type": job_type, "priority": priority,
                                     "attempt": attempt, "on_demand": on_demand,
                                     "payload": payload}}


_field = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2, max_value=3),
                   st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=3),
                   st.lists(st.integers(), max_size=1), st.just({}), st.just(_DROP))


def _is_int_at_least(value, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _job_id_ok(value) -> bool:
    return _is_int_at_least(value, -10**9) or isinstance(value, str)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["result", "progress", "error"]), _field, _field, _field, _field)
def test_validate_takes_exactly_the_worker_messages_whose_fields_are_right(kind, slot, job_id,
                                                                          result, error):
    msg = _with({"t": kind, "slot": 0, "job_id": 0, "result": 0, "error": "", "permanent": False},
                slot=slot, job_id=job_id, result=result, error=error)
    ok = _is_int_at_least(msg.get("slot"), 0) and _job_id_ok(msg.get("job_id")) and (
        kind != "result" or "result" in msg) and (kind != "error" or isinstance(msg.get("error"), str))
    if ok:
        assert validate(msg) is msg
    else:
        with pytest.raises(ProtocolError):
            validate(msg)


@settings(max_examples=500, deadline=None)
@given(_field, _field, _field, _field, _field, _field, _field, _field)
def test_validate_takes_exactly_the_run_messages_whose_fields_are_right(
        incarnation, slot, job_id, job_type, payload, priority, attempt, on_demand):
    job = _with(RUN["job"], id=job_id, type=job_type, payload=payload, priority=priority,
                attempt=attempt, on_demand=on_demand)
    msg = _with(RUN, incarnation=incarnation, slot=slot, job=job)
    ok = (isinstance(msg.get("incarnation"), str) and _is_int_at_least(msg.get("slot"), 0)
          and _job_id_ok(job.get("id")) and isinstance(job.get("type"), str)
          and "payload" in job and _is_int_at_least(job.get("priority"), -10**9)
          and _is_int_at_least(job.get("attempt"), 1) and isinstance(job.get("on_demand"), bool))
    if ok:
        assert validate(msg) is msg
    else:
        with pytest.raises(ProtocolError):
            validate(msg)


def test_docs_protocol_examples_constants_and_environment_match_the_code():
    from pathlib import Path

    from fairsched.worker.launch import LaunchSpec, worker_variables

    text = (Path(__file__).resolve().parent.parent / "docs" / "protocol.md").read_text()
    examples = [json.loads(block) for block in re.findall(r"```json\n(.*?)```", text, re.S)]
    assert {m["t"] for m in examples} == MESSAGE_TYPES  # one example of each message
    for msg in examples:
        assert validate(msg) is msg
        assert FrameDecoder().feed(encode(msg)) == [msg]
    run = next(m for m in examples if m["t"] == "run")
    decoded = FrameDecoder().feed(encode_run(
        run["incarnation"], run["slot"], run["job"]["id"], run["job"]["type"],
        run["job"]["priority"], run["job"]["attempt"], run["job"]["on_demand"],
        payload_json(run["job"]["payload"])[0], run["job"]["claim"]))[0]
    # The example shows the job's fields in the order the supervisor writes them.
    assert list(decoded["job"]) == list(run["job"])
    assert f"# The worker pipe protocol (version {PROTOCOL_VERSION})" in text
    assert f"`1 <= N <= {MAX_FRAME}`" in text
    assert re.search(rf"nests at most\s+{MAX_DEPTH} arrays or objects deep \(`MAX_DEPTH`\)", text)
    table = re.findall(r"^\| `(FAIRSCHED_\w+)` \|", text, re.M)
    spec = LaunchSpec(name="pdf-1", group="pdf", types=("pdf",), slots=1, handler="m:f",
                      command=None, cwd=Path("."), log_path=Path("pdf-1.log"),
                      database_url="postgresql://db.example/jobs")
    assert sorted(table) == sorted(worker_variables(spec, "pdf-1.1.ab"))


def test_the_exit_statuses_both_sides_read_are_sysexits_and_the_docs_say_them():
    from pathlib import Path

    import fairsched.supervisor.process as supervisor_side
    import fairsched.worker.runtime as worker_side

    assert (EXIT_CANNOT_START, EXIT_PROTOCOL, EXIT_SOFTWARE) == (
        os.EX_CONFIG, os.EX_PROTOCOL, os.EX_SOFTWARE)
    for side in (supervisor_side, worker_side):  # imported from here, not numbers of their own
        assert (side.EXIT_CANNOT_START, side.EXIT_PROTOCOL, side.EXIT_SOFTWARE) == (
            EXIT_CANNOT_START, EXIT_PROTOCOL, EXIT_SOFTWARE)
    text = " ".join((Path(__file__).resolve().parent.parent / "docs" / "protocol.md")
                    .read_text().split())
    assert f"**{EXIT_CANNOT_START}** (`EX_CONFIG`) before `hello`" in text
    assert (f"The Python runtime uses {EXIT_PROTOCOL} (`EX_PROTOCOL`) for a protocol error from "
            f"the supervisor and {EXIT_SOFTWARE} (`EX_SOFTWARE`) for an internal failure") in text
    assert ("`EXIT_CANNOT_START`, `EXIT_PROTOCOL` and `EXIT_SOFTWARE` in `fairsched.protocol`"
            in text)
