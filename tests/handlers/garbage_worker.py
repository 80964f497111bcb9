"""A worker that says hello, then sends garbage (or an oversized frame) when given work."""

import json
import os
import socket
import struct
import sys

sock = socket.socket(fileno=int(os.environ.get("FAIRSCHED_FD", "3")))


def send(msg):
    data = json.dumps(msg).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


send({"t": "hello", "protocol": 1, "pid": os.getpid(),
      "incarnation": os.environ["FAIRSCHED_INCARNATION"],
      "slots": int(os.environ["FAIRSCHED_SLOTS"]), "types": os.environ["FAIRSCHED_TYPES"].split(",")})
sock.recv(65536)  # the first run frame
if sys.argv[1:] == ["oversized"]:
    sock.sendall(struct.pack(">I", 0x7FFFFFFF) + b"x" * 100)
else:
    sock.sendall(b"\x00\x00\x00\x05hello")
sock.recv(65536)  # wait to be killed
