"""Handlers for the worker runtime and template tests (run with this folder as the worker's cwd)."""

import math
import os
import sys
import threading
import time
from pathlib import Path

import fairsched

IMPORTED_IN = os.getpid()  # a template-forked worker reports its template's pid here
WAIT = 10.0  # seconds a handler waits for something before giving up


def echo(job: fairsched.Job):
    return {"id": job.id, "type": job.type, "payload": job.payload, "priority": job.priority,
            "attempt": job.attempt, "on_demand": job.on_demand, "slot": job.slot,
            "pid": os.getpid(), "imported_in": IMPORTED_IN}


def gc_state(job: fairsched.Job):
    """What the garbage collector looks like in the worker: on, and what it leaves alone."""
    import gc

    return {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count(), "pid": os.getpid()}


def environment(job: fairsched.Job):
    """What the launcher set up: variables, directory, session, standard input."""
    stdin = os.fstat(0)
    devnull = os.stat(os.devnull)
    return {"env": {k: v for k, v in os.environ.items()
                    if k.startswith("FAIRSCHED_") or k in ("EXTRA", "PYTHONPATH")},
            "cwd": os.getcwd(), "sys_path_0": sys.path[0], "pid": os.getpid(), "sid": os.getsid(0),
            "stdin_is_devnull": (stdin.st_dev, stdin.st_ino) == (devnull.st_dev, devnull.st_ino)}


class _WriteOnly:
    """What a handler may put in sys.stderr's place (to send it to its logger, say)."""

    def write(self, text):
        return len(text)


def fail(job: fairsched.Job):
    if (job.payload or {}).get("close_stderr"):  # the log cannot be written any more
        sys.stderr.close()
    if (job.payload or {}).get("write_only_stderr"):  # no flush(), no fileno()
        sys.stderr = _WriteOnly()
    raise RuntimeError(f"boom on attempt {job.attempt}")


class Unspeakable(fairsched.PermanentError):
    def __str__(self):
        raise SystemExit(3)


def fail_unspeakably(job: fairsched.Job):
    raise Unspeakable()


def fail_permanently(job: fairsched.Job):
    raise fairsched.PermanentError("this input can never work")


def exit_in_handler(job: fairsched.Job):
    sys.exit(3)


def unserialisable(job: fairsched.Job):
    return {"tags": {"a", "b"}}


def _pages(job: fairsched.Job):
    yield {"page": 1}


async def _pages_async(job: fairsched.Job):
    yield {"page": 1}


def dispatches_to_a_generator(job: fairsched.Job):
    """A dispatcher whose handler for the job's type has a yield in it (by mistake)."""
    return _pages(job)


def dispatches_to_an_async_generator(job: fairsched.Job):
    return _pages_async(job)


class _Unreadable(dict):
    def items(self):
        raise RuntimeError("this mapping cannot be read")


def unreadable(job: fairsched.Job):
    return _Unreadable(a=1)


def huge(job: fairsched.Job):
    return "x" * (2 << 20)


def steps(job: fairsched.Job):
    for i in range(1, 4):
        job.progress(i / 4, f"step {i}")
    job.progress(None, "finishing")
    return "done"


def ignores_cancel(job: fairsched.Job):
    """Reports progress, then works on for a while without ever asking about a cancel."""
    job.progress(0.0, "working")
    time.sleep(0.3)
    return "done"


def until_cancelled(job: fairsched.Job):
    """Reports progress once, then waits for the cancel (or payload['seconds'])."""
    job.progress(0.0, "waiting for cancel")
    deadline = time.monotonic() + float((job.payload or {}).get("seconds", WAIT))
    while time.monotonic() < deadline:
        if job.cancelled():
            if (job.payload or {}).get("raise"):  # a handler that stops by raising
                raise (fairsched.PermanentError if job.payload["raise"] == "permanent"
                       else RuntimeError)("stopped by the cancel")
            if (job.payload or {}).get("partial"):  # what it has so far, which is no JSON
                return {"cancelled": True, "mean": math.nan, "seen": {1, 2}}
            return {"cancelled": True}
        time.sleep(0.005)
    return {"cancelled": False}


def leaves_progress_threads(job: fairsched.Job):
    """Starts threads that report progress on and on, and returns while they still do."""
    until = time.monotonic() + 0.2

    def report():
        while time.monotonic() < until:
            job.progress(0.5, "still at it")

    for _ in range(4):
        threading.Thread(target=report, daemon=True).start()
    time.sleep(0.02)
    return "done"


def rendezvous(job: fairsched.Job):
    """Marks itself arrived, then waits for its partner: only concurrent jobs both succeed."""
    folder = Path(job.payload["dir"])
    (folder / job.payload["me"]).write_text(str(job.slot))
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if (folder / job.payload["other"]).exists():
            return {"met": True, "slot": job.slot}
        time.sleep(0.005)
    return {"met": False, "slot": job.slot}


def threads(job: fairsched.Job):
    """How many threads the worker has while this job runs; with the payload "flood", first
    more progress frames than the socket holds (the write blocks until the peer reads)."""
    if job.payload == "flood":
        for _ in range(300):
            job.progress(None, "x" * 4000)
    return threading.active_count()


NOT_CALLABLE = 42


def deep(job: fairsched.Job):
    """A result nested payload['depth'] levels deep."""
    value = []
    for _ in range(job.payload["depth"] - 1):
        value = [value]
    return value


async def async_echo(job: fairsched.Job):
    """An `async def` handler: awaits, then echoes."""
    import asyncio

    await asyncio.sleep(0.01)
    return {"payload": job.payload, "awaited": True}


async def fails_in_a_task_group(job: fairsched.Job):
    """One task of a TaskGroup fails (for good, with payload "permanent"), the other is
    cancelled: the group raises an ExceptionGroup holding the failure."""
    import asyncio

    async def check():
        raise (fairsched.PermanentError if job.payload == "permanent"
               else ConnectionError)("this input can never work")

    async with asyncio.TaskGroup() as group:
        group.create_task(check())
        group.create_task(asyncio.sleep(WAIT))

def forks(job: fairsched.Job):
    """Forks, and both processes return from the handler: only the worker may answer."""
    pid = os.fork()
    if pid == 0:
        return {"from": "child"}
    os.waitpid(pid, 0)
    return {"from": "parent"}


def forks_and_reports(job: fairsched.Job):
    """Reports progress from a forked child, then from the worker itself."""
    pid = os.fork()
    if pid == 0:
        job.progress(0.5, "from the child")
        os._exit(0)
    os.waitpid(pid, 0)
    job.progress(1.0, "from the worker")
    return "done"


def terminates_a_child(job: fairsched.Job):
    """Starts a child process the way multiprocessing does on Linux (a fork), stops it with
    Process.terminate() (a SIGTERM), and says how it ended."""
    import multiprocessing

    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(WAIT,))
    child.start()
    time.sleep(0.05)
    child.terminate()
    child.join(WAIT / 2)
    return {"exitcode": child.exitcode, "cancelled": job.cancelled()}


def generator(job: fairsched.Job):
    yield job.id


def no_arguments():
    return None


class AsyncCallable:
    async def __call__(self, job: fairsched.Job):
        return {"called": job.id}


async_callable = AsyncCallable()


async def leaves_a_stubborn_task(job: fairsched.Job):
    """Returns, leaving a task behind that swallows every cancel."""
    import asyncio

    async def stubborn():
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue

    job.payload["task"] = asyncio.get_running_loop().create_task(stubborn())
    await asyncio.sleep(0)
    return "returned"


async def leaves_a_generator(job: fairsched.Job):
    """Returns, leaving an async generator open whose cleanup swallows every cancel."""
    import asyncio

    async def rows():
        try:
            yield 1
        finally:
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    continue

    job.payload["rows"] = rows()
    await anext(job.payload["rows"])
    return "returned"


async def leaves_a_thread(job: fairsched.Job):
    """Raises, leaving a run_in_executor thread blocked for a minute."""
    import asyncio
    import time

    asyncio.get_running_loop().run_in_executor(None, time.sleep, 60)
    raise ValueError("gave up")


class _NoSignature:
    """A callable that inspect cannot describe (as some proxies and wrappers are)."""

    @property
    def __signature__(self):
        raise RuntimeError("no signature here")

    def __call__(self, job: fairsched.Job):
        return {"called": job.id}


no_signature = _NoSignature()


def transactional(job: fairsched.Job):
    """Writes a row for its job in tx_rows inside job.transaction(). Payload: "wait", a FIFO
    to read a line from inside the block (after saying so in a progress report); "fail",
    raise inside the block; "raise_after", raise once it committed."""
    p = job.payload or {}
    with job.transaction() as conn:
        conn.execute("INSERT INTO tx_rows (job_id, attempt) VALUES (%s, %s)",
                     (str(job.id), job.attempt))
        if p.get("wait"):
            job.progress(0.5, "inside")
            with open(p["wait"]) as fifo:  # until the test writes to it
                fifo.readline()
        if p.get("fail"):
            raise RuntimeError("failed inside the block")
    if p.get("raise_after"):
        raise RuntimeError("raised after the commit")
    return "returned"


def transaction_in_a_fork(job: fairsched.Job):
    """What job.transaction() says in a process the handler forked."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            with job.transaction():
                said = "it committed"
        except Exception as exc:
            said = f"{type(exc).__name__}: {exc}"
        os.write(write_end, said.encode())
        os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    with os.fdopen(read_end) as f:
        return f.read()
