"""What the web dashboard costs the supervisor: the on-demand round trip with and without pages
open, in interleaved rounds on one supervisor.

    .venv/bin/python scripts/bench_dashboard.py [--requests 1000] [--pages 5] [--rounds 20]

A page is what the dashboard's own page does, from a process of its own: it follows the slots
(GET /api/ps/stream, a frame a second, read as it comes) and reads the queue's counts and the
failed jobs every 5 seconds. Each round measures `--requests` on-demand round trips (no-op
handler, idle slot) without pages, then with `--pages` open (the order alternating; many
short rounds, so that a drift of the machine hits both alike); prints p50/p99 of each round,
of all rounds together, and the ratio of the p99s (the target: within 10 %); then the
supervisor's CPU time while no job runs, without and with the pages. Uses
FAIRSCHED_DATABASE_URL when set, else an embedded PostgreSQL in a temporary state_dir.
"""

from __future__ import annotations

import argparse
import http.client
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

from bench_ondemand import idle_cpu, on_demand, pct, start_supervisor

POLL_EVERY = 5.0  # seconds between two readings of the queue by the page (app.js, POLL_MS)

WORKERS = """
[[worker]]
name = "noop"
types = ["noop"]
handler = "bench_handlers:noop"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the pages, in a process of their own ----------------------------------------------------------

class Page:
    """One page: follows the slots and polls the queue on two connections, until `close`."""

    def __init__(self, port: int):
        self.port = port
        self.frames = 0
        self.ready = threading.Event()
        self.closed = threading.Event()
        self.stream = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        threading.Thread(target=self.follow, daemon=True).start()
        threading.Thread(target=self.poll, daemon=True).start()

    def follow(self) -> None:
        self.stream.request("GET", "/api/ps/stream")
        resp = self.stream.getresponse()
        assert resp.status == 200, resp.status
        while not self.closed.is_set():
            try:
                line = resp.fp.readline()
            except (OSError, ValueError):  # closed under it
                return
            if not line:
                return
            if line.startswith(b"event: ps"):
                self.frames += 1
                self.ready.set()

    def poll(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        # Pages opened at once poll at random moments apart, not all at their opening.
        self.closed.wait(random.uniform(0, POLL_EVERY))
        while not self.closed.is_set():
            for path in ("/api/counts", "/api/jobs?limit=50&status=failed"):
                conn.request("GET", path)
                resp = conn.getresponse()
                resp.read()
                assert resp.status == 200, (path, resp.status)
            self.closed.wait(POLL_EVERY)
        conn.close()

    def close(self) -> None:
        self.closed.set()
        if self.stream.sock is not None:
            self.stream.sock.shutdown(socket.SHUT_RDWR)


def serve_pages(port: int, n: int) -> None:
    """On "open" from stdin, open `n` pages and say "ready" once each has had a frame; on
    "close", close them and say how many frames each had."""
    opened: list[Page] = []
    for command in sys.stdin:
        if command.strip() == "open":
            opened = [Page(port) for _ in range(n)]
            for page in opened:
                page.ready.wait(30)
            print("ready", flush=True)
        else:
            for page in opened:
                page.close()
            print(" ".join(str(page.frames) for page in opened), flush=True)


# -- the measurement -------------------------------------------------------------------------------

class Pages:
    """The process of the pages, opened and closed on demand."""

    def __init__(self, port: int, n: int):
        self.n = n
        self.child = subprocess.Popen([sys.executable, __file__, "--pages-of", str(port),
                                       "--pages", str(n)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)

    def _say(self, command: str) -> str:
        self.child.stdin.write(command + "\n")
        self.child.stdin.flush()
        return self.child.stdout.readline().strip()

    def open(self) -> None:
        if self._say("open") != "ready":
            raise SystemExit("the pages did not open")

    def close(self) -> list[int]:
        frames = [int(f) for f in self._say("close").split()]
        if len(frames) != self.n or min(frames) < 1:
            raise SystemExit(f"a page had no frame: {frames}")
        return frames

    def end(self) -> None:
        self.child.kill()
        self.child.wait()


def line(label: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return f"{label:26s} p50 {pct(ms, 50):7.3f} ms   p99 {pct(ms, 99):7.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--pages", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--pages-of", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pages_of:
        return serve_pages(args.pages_of, args.pages)

    folder = Path(tempfile.mkdtemp(prefix="fsb-", dir="/tmp"))
    port = free_port()
    proc, client = start_supervisor(
        folder, textwrap.dedent(f"""
            web = "127.0.0.1:{port}"
            """) + WORKERS)
    try:
        on_demand(client, 200)  # warm up
        pages = Pages(port, args.pages)
        without: list[float] = []
        opened: list[float] = []
        rows = []
        try:
            for r in range(args.rounds):
                order = ("without", "with") if r % 2 == 0 else ("with", "without")
                got = {}
                for which in order:
                    if which == "with":
                        pages.open()
                    got[which] = on_demand(client, args.requests)
                    if which == "with":
                        frames = pages.close()
                without += got["without"]
                opened += got["with"]
                rows.append((r + 1, got["without"], got["with"], frames))
            print(f"on-demand round trip, {args.requests} requests a round, {args.pages} pages "
                  f"following the slots and polling the queue")
            print(f"{'round':6s} {'p50 / p99 without (ms)':>24s} {'p50 / p99 with (ms)':>24s}   "
                  "frames per page")
            for r, a, b, frames in rows:
                print(f"{r:<6d} {pct(a, 50) * 1000:10.3f} / {pct(a, 99) * 1000:9.3f}  "
                      f"{pct(b, 50) * 1000:10.3f} / {pct(b, 99) * 1000:9.3f}   "
                      + " ".join(map(str, frames)))
            print(line("all rounds, without", without))
            print(line(f"all rounds, {args.pages} pages open", opened))
            print(f"p99 with / without: {pct(opened, 99) / pct(without, 99):.3f} (target <= 1.10); "
                  "the median of the rounds' p99s: "
                  f"{statistics.median(pct(b, 99) for _, _, b, _ in rows) * 1000:.3f} ms with, "
                  f"{statistics.median(pct(a, 99) for _, a, _, _ in rows) * 1000:.3f} ms without")
            seconds = 5.0
            idle = idle_cpu(proc.pid, seconds)
            pages.open()
            busy = idle_cpu(proc.pid, seconds)
            pages.close()
            print(f"the supervisor's CPU while no job runs: {idle} without pages; with them: {busy}")
        finally:
            pages.end()
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
