#!/usr/bin/env python3
"""A fairsched worker written against docs/protocol.md alone: standard library, no fairsched.

It handles every type listed in FAIRSCHED_TYPES by echoing the payload back, e.g.
{"echo": {...}, "pid": 1234, "type": "pdf"}; a payload {"fail": "why"} fails the job
permanently. One slot, jobs run one after another. Use it as a `command` worker:

    [[worker]]
    name = "echo"
    types = ["echo"]
    command = ["python3", "standalone_worker.py"]   # runs in the folder of workers.toml
"""

import json
import os
import signal
import socket
import struct
import sys

MAX_FRAME = 1 << 20
HEADER = struct.Struct(">I")


class Channel:
    """Length-prefixed JSON frames over the socket on FAIRSCHED_FD."""

    def __init__(self, fd):
        self.sock = socket.socket(fileno=fd)
        self.sock.setblocking(True)
        self.buf = b""

    def send(self, msg):
        body = json.dumps(msg, separators=(",", ":")).encode("utf-8")
        self.sock.sendall(HEADER.pack(len(body)) + body)

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def receive(self):
        """The next message, or None at EOF (the supervisor is gone)."""
        header = self._read(4)
        if header is None:
            return None
        (size,) = HEADER.unpack(header)
        if size == 0 or size > MAX_FRAME:
            raise ValueError(f"frame of {size} bytes is outside 1..{MAX_FRAME}")
        body = self._read(size)
        if body is None:
            return None
        msg = json.loads(body.decode("utf-8"))
        if not isinstance(msg, dict) or not isinstance(msg.get("t"), str):
            raise ValueError("frame is not an object with a string field 't'")
        return msg


def main():
    try:
        fd = int(os.environ["FAIRSCHED_FD"])
        incarnation = os.environ["FAIRSCHED_INCARNATION"]
        types = [t for t in os.environ["FAIRSCHED_TYPES"].split(",") if t]
        if os.environ.get("FAIRSCHED_PROTOCOL", "1") != "1":
            raise ValueError("this worker speaks protocol 1 only")
        channel = Channel(fd)
    except (KeyError, ValueError, OSError) as exc:
        print(f"standalone worker could not start: {exc!r}", file=sys.stderr)
        sys.exit(78)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # nothing to finish between jobs
    channel.send({"t": "hello", "protocol": 1, "pid": os.getpid(),
                  "incarnation": incarnation, "slots": 1, "types": types})
    while True:
        try:
            msg = channel.receive()
        except ValueError as exc:
            print(f"standalone worker: bad frame: {exc}", file=sys.stderr)
            os._exit(76)
        if msg is None or msg["t"] == "stop":
            os._exit(0)
        if msg["t"] != "run":
            continue  # a cancel: jobs here finish before the next frame is even read
        job = msg["job"]
        head = {"slot": msg["slot"], "job_id": job["id"]}
        if msg["incarnation"] != incarnation:
            channel.send({"t": "refused", **head, "reason": "not my incarnation"})
        elif msg["slot"] != 0:
            channel.send({"t": "refused", **head, "reason": f"no slot {msg['slot']}"})
        elif job["type"] not in types:
            channel.send({"t": "refused", **head, "reason": f"type {job['type']!r} unsupported"})
        elif isinstance(job["payload"], dict) and "fail" in job["payload"]:
            channel.send({"t": "error", **head, "error": str(job["payload"]["fail"]),
                          "permanent": True})
        else:
            channel.send({"t": "progress", **head, "fraction": 0.5, "message": "echoing"})
            channel.send({"t": "result", **head,
                          "result": {"echo": job["payload"], "pid": os.getpid(),
                                     "type": job["type"]}})


if __name__ == "__main__":
    main()
