#!/usr/bin/env python3
"""How fast a worker is ready, and how much memory it takes: cold launch vs template spawn.

    .venv/bin/python scripts/bench_spawn.py [--spawns 50] [--jobs 2000] [--workers 4]

Prints median and p99 of: start to hello (cold `python -m fairsched.worker` vs a fork from the
group's template), SIGKILL of a worker to its replacement's hello (both ways), and one job's
run -> result round trip over the socketpair. The handler imports `json`, `decimal` and
`email.parser` (a few ms of imports) so the template's saving is visible.

Then memory: --workers workers each way of a handler that builds a 200,000-entry table when
imported (what a real one loads: a model, a font cache), each after 20 jobs that end in a full
garbage collection (which a long-lived worker meets sooner or later). Per worker, the median
USS (memory only it holds) and PSS (its share of what it shares), from /proc through psutil.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fairsched.protocol import WORKER_MESSAGES, FrameDecoder, encode
from fairsched.supervisor.template_process import Template
from fairsched.worker.launch import Launched, LaunchSpec, become_subreaper, launch

HANDLER = '''
import decimal, email.parser, json  # noqa: F401 - a handler with some imports to pay for

def echo(job):
    return job.payload
'''

MEMORY_HANDLER = '''
import gc

TABLE = {f"key-{i}": [i, str(i)] for i in range(200_000)}  # loaded at import, then only read

def lookup(job):
    scratch = [{"n": n} for n in range(2000)]  # a job allocates and frees ...
    gc.collect()  # ... and sooner or later meets a full collection
    return len(TABLE) + len(scratch)
'''
MEMORY_JOBS = 20


class Conn:
    def __init__(self, launched):
        self.pid = launched.pid
        self.sock = launched.sock
        self.decoder = FrameDecoder(WORKER_MESSAGES)
        self.inbox = []

    def recv(self, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        while not self.inbox:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                raise TimeoutError(f"worker {self.pid} sent nothing within {timeout} s")
            data = self.sock.recv(1 << 16)
            if not data:
                raise EOFError(f"worker {self.pid} closed its socket")
            self.inbox.extend(self.decoder.feed(data))
        return self.inbox.pop(0)

    def send(self, msg: dict) -> None:
        self.sock.setblocking(True)
        self.sock.sendall(encode(msg))
        self.sock.setblocking(False)

    def stop(self) -> None:
        self.send({"t": "stop"})
        os.waitpid(self.pid, 0)
        self.sock.close()


def from_template(template: Template):
    """A launcher that forks from `template` as the supervisor does: the request sent without
    waiting (begin_spawn), the pid read once the template's answer is there (read_reply)."""
    def spawn(spec: LaunchSpec, incarnation: str) -> Launched:
        sock = template.begin_spawn(spec, incarnation)
        select.select([template.fileno()], [], [])
        reply = template.read_reply()
        if not reply or not isinstance(reply.get("pid"), int):
            sock.close()
            raise RuntimeError(f"template could not start {spec.name}: {reply}")
        return Launched(reply["pid"], sock)
    return spawn


def stats(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return f"median {statistics.median(ms):7.2f} ms   p99 {p99:7.2f} ms   (n={len(ms)})"


def start(how, spec: LaunchSpec, n: int) -> Conn:
    conn = Conn(how(spec, f"{spec.name}.{n}"))
    hello = conn.recv()
    assert hello["t"] == "hello", hello
    return conn


def to_hello(how, spec, count: int) -> list[float]:
    out = []
    for n in range(count):
        t0 = time.perf_counter()
        conn = start(how, spec, n)
        out.append(time.perf_counter() - t0)
        conn.stop()
    return out


def replacement(how, spec, count: int) -> list[float]:
    """SIGKILL a worker; time until EOF is seen, it is reaped and its successor says hello."""
    out = []
    conn = start(how, spec, 0)
    for n in range(1, count + 1):
        t0 = time.perf_counter()
        os.kill(conn.pid, signal.SIGKILL)
        select.select([conn.sock], [], [])
        assert conn.sock.recv(1) == b""
        os.waitpid(conn.pid, 0)
        conn.sock.close()
        conn = start(how, spec, n)
        out.append(time.perf_counter() - t0)
    conn.stop()
    return out


def round_trips(how, spec, count: int) -> list[float]:
    conn = start(how, spec, 0)
    out = []
    for n in range(count):
        t0 = time.perf_counter()
        conn.send({"t": "run", "incarnation": f"{spec.name}.0", "slot": 0,
                   "job": {"id": n, "type": "echo", "payload": {"n": n}, "priority": 0,
                           "attempt": 1, "on_demand": True}})
        msg = conn.recv()
        out.append(time.perf_counter() - t0)
        assert msg["t"] == "result", msg
    conn.stop()
    return out


def memory(how, spec, count: int) -> tuple[list[float], list[float]]:
    """USS and PSS (MiB) of `count` workers, each after MEMORY_JOBS jobs."""
    import psutil

    conns = [start(how, spec, n) for n in range(count)]
    uss, pss = [], []
    try:
        for conn in conns:
            for n in range(MEMORY_JOBS):
                conn.send({"t": "run", "incarnation": f"{spec.name}.{conns.index(conn)}",
                           "slot": 0, "job": {"id": n, "type": "lookup", "payload": None,
                                              "priority": 0, "attempt": 1, "on_demand": True}})
                msg = conn.recv()
                assert msg["t"] == "result", msg
        for conn in conns:
            info = psutil.Process(conn.pid).memory_full_info()
            uss.append(info.uss / 2**20)
            pss.append(info.pss / 2**20)
    finally:
        for conn in conns:
            conn.stop()
    return uss, pss


@contextlib.contextmanager
def ready_template(folder: Path, group: str, source: str, handler: str):
    """A started template of `handler` (written from `source` into folder) and its spec; the
    one job type is named after the handler function."""
    module, function = handler.split(":")
    (folder / f"{module}.py").write_text(source)
    spec = LaunchSpec(name=f"{group}-1", group=group, types=(function,), slots=1,
                      handler=handler, command=None, cwd=folder,
                      log_path=folder / f"{group}-1.log", env={})
    template = Template.start(spec)
    try:
        template.wait_ready()
        yield template, spec
    finally:
        template.close()
        os.waitpid(template.pid, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawns", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    if not become_subreaper():
        sys.exit("this benchmark needs Linux (PR_SET_CHILD_SUBREAPER)")
    folder = Path(tempfile.mkdtemp(prefix="fs-bench-"))
    try:
        with ready_template(folder, "bench", HANDLER, "bench_handler:echo") as (template, spec):
            fork = from_template(template)
            print(f"start to hello, {args.spawns} spawns each")
            print(f"  cold launch     {stats(to_hello(launch, spec, args.spawns))}")
            print(f"  template spawn  {stats(to_hello(fork, spec, args.spawns))}")
            print(f"crash (SIGKILL) to replacement's hello, {args.spawns} each")
            print(f"  cold launch     {stats(replacement(launch, spec, args.spawns))}")
            print(f"  template spawn  {stats(replacement(fork, spec, args.spawns))}")
            print(f"run -> result round trip, {args.jobs} jobs")
            print(f"  one slot        {stats(round_trips(fork, spec, args.jobs))}")
        with ready_template(folder, "mem", MEMORY_HANDLER, "bench_memory:lookup") as (template,
                                                                                      spec):
            print(f"memory per worker, {args.workers} workers each way, after {MEMORY_JOBS} jobs"
                  " with a full collection each (MiB, median)")
            sizes = {"cold launch": memory(launch, spec, args.workers),
                     "template spawn": memory(from_template(template), spec, args.workers)}
            for name, (uss, pss) in sizes.items():
                print(f"  {name:<15} USS {statistics.median(uss):6.1f}"
                      f"   PSS {statistics.median(pss):6.1f}")
            cold, forked = (statistics.median(sizes[k][0]) for k in sizes)
            print(f"  a template-spawned worker holds {cold / forked:.1f}x less memory of its own")
    finally:
        shutil.rmtree(folder, ignore_errors=True)

if __name__ == "__main__":
    main()
