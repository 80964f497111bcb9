"""On-demand round trip and crash recovery latencies, beside the floor measured in the same run.

    .venv/bin/python scripts/bench_ondemand.py [--requests 2000] [--kills 100]

Prints p50/p99 of: a raw Unix-socket echo and a raw pipe echo (the floor), a fairsched
on-demand request (no-op handler, idle slot) over the control socket; then, over N kill -9 of
a worker, crash-to-unregister (slot leaves the pool) and crash-to-replacement-ready latencies.
Uses FAIRSCHED_DATABASE_URL when set, else an embedded PostgreSQL in a temporary state_dir.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fairsched.control_client import ControlClient  # noqa: E402

HANDLER = '''
def noop(job):
    return None
'''


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def fmt(values):
    ms = [v * 1000 for v in values]
    return f"p50 {pct(ms, 50):7.3f} ms   p99 {pct(ms, 99):7.3f} ms   max {max(ms):7.3f} ms"


def echo_child(read_fd: int, write_fd: int, close: tuple[int, ...]) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            for fd in close:  # the parent's ends: without this the child never sees EOF
                os.close(fd)
            while True:
                data = os.read(read_fd, 65536)
                if not data:
                    break
                os.write(write_fd, data)
        finally:
            os._exit(0)
    return pid


def floor_socket(n: int) -> list[float]:
    a, b = socket.socketpair()
    pid = echo_child(b.fileno(), b.fileno(), (a.fileno(),))
    b.close()
    msg = b'{"t":"run","slot":0,"job":{"id":"od-1","type":"pdf","payload":null}}'
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        a.sendall(msg)
        a.recv(65536)
        out.append(time.perf_counter() - t0)
    a.close()
    os.waitpid(pid, 0)
    return out


def floor_pipe(n: int) -> list[float]:
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = echo_child(r1, w2, (w1, r2))
    os.close(r1)
    os.close(w2)
    msg = b'{"t":"run","slot":0,"job":{"id":"od-1","type":"pdf","payload":null}}'
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        os.write(w1, msg)
        os.read(r2, 65536)
        out.append(time.perf_counter() - t0)
    os.close(w1)
    os.waitpid(pid, 0)
    os.close(r2)
    return out


def start_supervisor(folder: Path, workers: str) -> tuple[subprocess.Popen, ControlClient]:
    (folder / "bench_handlers.py").write_text(HANDLER)
    config = folder / "workers.toml"
    config.write_text(textwrap.dedent("""
        [supervisor]
        state_dir = "state"
        """) + workers)
    log = open(folder / "supervisor.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "fairsched", "supervise", "--config", str(config),
                             "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT)
    client = ControlClient(folder / "state" / "control" / "sock")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            ps = client.ps()
            if all(s["state"] == "free" for s in ps["slots"]):
                return proc, client
        except Exception:
            pass
        if proc.poll() is not None:
            raise SystemExit((folder / "supervisor.log").read_text())
        time.sleep(0.05)
    raise SystemExit("supervisor did not become ready")


def on_demand(client: ControlClient, n: int) -> list[float]:
    out = []
    request = {"cmd": "submit", "type": "noop", "payload": None, "priority": 0}
    for _ in range(n):
        t0 = time.perf_counter()
        for event in client.stream(request):
            if event["event"] == "result":
                break
            if event["event"] in ("error", "refused", "timeout"):
                raise SystemExit(f"on-demand request failed: {event}")
        out.append(time.perf_counter() - t0)
    return out


def crash_latencies(client: ControlClient, kills: int) -> tuple[list[float], list[float]]:
    unregister, ready = [], []
    for _ in range(kills):
        row = client.ps()["slots"][0]
        pid = row["pid"]
        t0 = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        t_unreg = None
        while True:
            row = client.ps()["slots"][0]
            now = time.perf_counter()
            if t_unreg is None and (row["state"] != "free" or row["pid"] != pid):
                t_unreg = now
            if row["state"] == "free" and row["pid"] not in (None, pid):
                break
            if now - t0 > 30:
                raise SystemExit(f"worker not replaced: {json.dumps(row)}")
        unregister.append(t_unreg - t0)
        ready.append(now - t0)
        time.sleep(0.01)
    return unregister, ready


def idle_cpu(pid: int, seconds: float) -> str:
    """The supervisor's own CPU time while nothing happens (its heartbeats and polls)."""
    import psutil

    process = psutil.Process(pid)
    time.sleep(2.0)  # the kills' restarts settle
    before = sum(process.cpu_times()[:2])
    time.sleep(seconds)
    used = sum(process.cpu_times()[:2]) - before
    return f"{used * 1000:.0f} ms in {seconds:g} s ({100 * used / seconds:.2f}% of a core)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--idle", type=float, default=10.0,
                        help="seconds to measure the idle supervisor's CPU over")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="fsb-", dir="/tmp"))
    workers = textwrap.dedent("""
        [[worker]]
        name = "noop"
        types = ["noop"]
        handler = "bench_handlers:noop"
        max_restarts = 1000000
        restart_window = 0.001
        """)
    proc, client = start_supervisor(folder, workers)
    try:
        on_demand(client, 200)  # warm up
        print(f"{'raw unix socket echo':28s} {fmt(floor_socket(args.requests))}")
        print(f"{'raw pipe echo':28s} {fmt(floor_pipe(args.requests))}")
        rt = on_demand(client, args.requests)
        print(f"{'fairsched on-demand':28s} {fmt(rt)}")
        ps = client.ps()
        print(f"(core {ps['supervisor']['core']}, database {ps['supervisor']['database']}; "
              "targets: p50 <= 1 ms, p99 <= 5 ms)")
        unregister, ready = crash_latencies(client, args.kills)
        print(f"{'crash to unregister':28s} {fmt(unregister)}   (target p99 <= 10 ms)")
        print(f"{'crash to replacement ready':28s} {fmt(ready)}   (target <= 100 ms)")
        print(f"over {args.kills} kills (ps polled over the control socket; resolution ~0.3 ms)")
        if args.idle > 0:
            print(f"{'idle supervisor CPU':28s} {idle_cpu(proc.pid, args.idle)}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
