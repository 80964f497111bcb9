"""A worker that misbehaves as argv[1] says: `garbage` or `oversized` frames when given work,
`hangup` (closes its pipe when given work, then lives on), `mute` (never says hello) or
`refuse` (refuses every job it is given, exits 0 when told to stop) or `deaf` (starts a
`sleep` for its first job, writes "<its pid> <the sleep's pid>" to the job's payload["pids"],
and never reads its pipe again), `fatal` (says it cannot start, exits 78; why: $FATAL_ERROR, or no licence file), `stranger` (answers
its first job with a result for another job), `texted` (answers its first job with a progress and
a result that give its id as a string), `trailing` (answers its first job with a result and, in the same write, a bad frame),
`scribble` (reports progress with fields of the
wrong type or range, then succeeds), `cut` (writes half a frame and exits), `early` (says why on
stderr and exits 1 before its hello), `future` (says hello in protocol 2), `odd` (announces one slot
fewer than configured and a type more, then runs as `picky`) or `picky` (refuses the
jobs whose payload has "refuse": true, fails for good those with an "error", says it stopped
those with "stop": true at once (as if told to stop, yet running on), runs the others
for payload["seconds"], and answers
`stop` with a stopped result for each job it runs) or `deep` (answers each job with a result
nested payload["depth"] levels deep) or `chatty` (answers each job with a result, then sends
300 progress frames for it and 300 results for a job it was never given) or `verbose` (reports
progress on its first job with a message of a million characters, then never answers)."""

import json
import os
import select
import socket
import struct
import subprocess
import sys
import time

sock = socket.socket(fileno=int(os.environ.get("FAIRSCHED_FD", "3")))
mode = sys.argv[1]


def send(msg):
    data = json.dumps(msg).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


if mode == "mute":
    time.sleep(600)
if mode == "early":
    print("licence server unreachable", file=sys.stderr)
    sys.exit(1)
if mode == "fatal":
    send({"t": "fatal", "error": os.environ.get("FATAL_ERROR", "no licence file in /etc/render")})
    sys.exit(78)


def messages():
    """The supervisor's messages, one at a time (None after `timeout` without one); exits 0 at
    EOF."""
    buffer = b""
    timeout = yield
    while True:
        while len(buffer) >= 4 and len(buffer) >= 4 + struct.unpack(">I", buffer[:4])[0]:
            size = struct.unpack(">I", buffer[:4])[0]
            msg, buffer = json.loads(buffer[4:4 + size]), buffer[4 + size:]
            timeout = yield msg
        if not select.select([sock], [], [], timeout)[0]:
            timeout = yield None
            continue
        data = sock.recv(65536)
        if not data:
            sys.exit(0)
        buffer += data


send({"t": "hello", "protocol": 2 if mode == "future" else 1, "pid": os.getpid(),
      "incarnation": os.environ["FAIRSCHED_INCARNATION"],
      "slots": int(os.environ["FAIRSCHED_SLOTS"]) - (mode == "odd"),
      "types": os.environ["FAIRSCHED_TYPES"].split(",") + (["extra"] if mode == "odd" else [])})
if mode == "future":
    time.sleep(600)
if mode in ("refuse", "picky", "odd", "deep", "chatty"):
    inbox = messages()
    next(inbox)
    running = {}  # slot: (job id, when it ends)
    while True:
        ends = min((end for _, end in running.values()), default=None)
        msg = inbox.send(None if ends is None else max(0.0, ends - time.monotonic()))
        for slot, (job_id, end) in list(running.items()):
            if end <= time.monotonic():
                send({"t": "result", "slot": slot, "job_id": job_id, "result": {"pid": os.getpid()}})
                del running[slot]
        if msg is None:
            continue
        if msg["t"] == "stop":
            for slot, (job_id, _) in running.items():
                send({"t": "result", "slot": slot, "job_id": job_id, "result": None,
                      "stopped": True})
            sys.exit(0)
        if msg["t"] == "run":
            payload = msg["job"]["payload"] if isinstance(msg["job"]["payload"], dict) else {}
            if mode == "deep":  # a result that nests payload["depth"] levels deep
                depth = payload["depth"]
                body = (f'{{"t":"result","slot":{msg["slot"]},'
                        f'"job_id":{json.dumps(msg["job"]["id"])},'
                        f'"result":{"[" * depth + "]" * depth}}}')
                sock.sendall(struct.pack(">I", len(body)) + body.encode())
            elif mode == "chatty":
                send({"t": "result", "slot": msg["slot"], "job_id": msg["job"]["id"],
                      "result": {"pid": os.getpid()}})
                for _ in range(300):
                    send({"t": "progress", "slot": msg["slot"], "job_id": msg["job"]["id"],
                          "fraction": 0.5})
                    send({"t": "result", "slot": msg["slot"], "job_id": "ghost", "result": None})
            elif mode == "refuse" or payload.get("refuse"):
                send({"t": "refused", "slot": msg["slot"], "job_id": msg["job"]["id"],
                      "reason": "not today"})
            elif payload.get("stop"):
                send({"t": "result", "slot": msg["slot"], "job_id": msg["job"]["id"],
                      "result": None, "stopped": True})
            elif "error" in payload:
                send({"t": "error", "slot": msg["slot"], "job_id": msg["job"]["id"],
                      "error": payload["error"], "permanent": True})
            else:
                running[msg["slot"]] = (msg["job"]["id"],
                                        time.monotonic() + payload.get("seconds", 0))
if mode == "deaf":
    data = sock.recv(65536)
    while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
        data += sock.recv(65536)
    job = json.loads(data[4:4 + struct.unpack(">I", data[:4])[0]])["job"]
    child = subprocess.Popen(["sleep", "600"])
    with open(job["payload"]["pids"], "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    time.sleep(600)
first = sock.recv(65536)  # the first run frame
run = json.loads(first[4:4 + struct.unpack(">I", first[:4])[0]])
slot, job_id = run["slot"], run["job"]["id"]
if mode == "stranger":
    send({"t": "result", "slot": slot, "job_id": f"not-{job_id}", "result": None})
elif mode == "texted":
    send({"t": "progress", "slot": slot, "job_id": str(job_id), "fraction": 0.5})
    send({"t": "result", "slot": slot, "job_id": str(job_id), "result": None})
elif mode == "scribble":
    send({"t": "progress", "slot": slot, "job_id": job_id, "fraction": "half", "message": 5})
    send({"t": "progress", "slot": slot, "job_id": job_id, "fraction": 1.0000001})
    send({"t": "progress", "slot": slot, "job_id": job_id, "fraction": 10**400})  # no double's
    send({"t": "progress", "slot": slot, "job_id": job_id, "fraction": None, "message": []})
    send({"t": "result", "slot": slot, "job_id": job_id, "result": {"scribbled": True}})
elif mode == "verbose":
    send({"t": "progress", "slot": slot, "job_id": job_id, "fraction": 0.5,
          "message": "M" * 1_000_000})
elif mode == "trailing":
    body = json.dumps({"t": "result", "slot": slot, "job_id": job_id, "result": {"ok": 1}})
    sock.sendall(struct.pack(">I", len(body)) + body.encode() + b"\x00\x00\x00\x05hello")
elif mode == "cut":
    sock.sendall(struct.pack(">I", 50) + b'{"t": "res')
    sys.exit(0)
elif mode == "oversized":
    sock.sendall(struct.pack(">I", 0x7FFFFFFF) + b"x" * 100)
elif mode == "hangup":
    sock.close()
    time.sleep(600)
else:
    sock.sendall(b"\x00\x00\x00\x05hello")
sock.recv(65536)  # wait to be killed
