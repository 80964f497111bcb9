"""A worker that misbehaves as argv[1] says: `garbage` or `oversized` frames when given work,
`hangup` (closes its pipe when given work, then lives on) or `mute` (never says hello)."""

import json
import os
import socket
import struct
import sys
import time

sock = socket.socket(fileno=int(os.environ.get("FAIRSCHED_FD", "3")))
mode = sys.argv[1]


def send(msg):
    data = json.dumps(msg).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


if mode == "mute":
    time.sleep(600)
send({"t": "hello", "protocol": 1, "pid": os.getpid(),
      "incarnation": os.environ["FAIRSCHED_INCARNATION"],
      "slots": int(os.environ["FAIRSCHED_SLOTS"]), "types": os.environ["FAIRSCHED_TYPES"].split(",")})
sock.recv(65536)  # the first run frame
if mode == "oversized":
    sock.sendall(struct.pack(">I", 0x7FFFFFFF) + b"x" * 100)
elif mode == "hangup":
    sock.close()
    time.sleep(600)
else:
    sock.sendall(b"\x00\x00\x00\x05hello")
sock.recv(65536)  # wait to be killed
