"""Handlers for the supervisor tests; copied beside each test's workers.toml."""

import asyncio
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

import fairsched

HERE = Path(__file__).parent

if (HERE / "crash-at-start").exists():
    os._exit(3)  # a worker that dies before saying hello, every time


def echo(job: fairsched.Job):
    return {"payload": job.payload, "type": job.type, "pid": os.getpid(), "attempt": job.attempt}


def measure(job: fairsched.Job):
    """The payload's length and the characters in it: a small result for a large payload."""
    return {"length": len(job.payload), "characters": sorted(set(job.payload))}


def slow(job: fairsched.Job):
    """Sleeps payload['seconds'], reporting progress; honours cancel unless told not to."""
    seconds = float((job.payload or {}).get("seconds", 1))
    stubborn = bool((job.payload or {}).get("ignore_cancel"))
    marker = (job.payload or {}).get("started")
    if marker:
        Path(marker).write_text(str(os.getpid()))
    deadline = time.monotonic() + seconds
    job.progress(0.0, "started")
    while time.monotonic() < deadline:
        if not stubborn and job.cancelled():  # asking would count as stopping early
            return {"cancelled": True}
        time.sleep(0.02)
    job.progress(1.0, "done")
    return {"slept": seconds, "pid": os.getpid(), "attempt": job.attempt}


def with_child(job: fairsched.Job):
    """Starts a long `sleep` (in the worker's process group, as subprocesses are), writes its
    pid to payload['pidfile'], and waits for it."""
    child = subprocess.Popen(["sleep", "60"])
    Path(job.payload["pidfile"]).write_text(str(child.pid))
    child.wait()
    return {"child": child.pid}


def hold_gil(job: fairsched.Job):
    """Spends about payload['seconds'] in one C call that keeps the GIL: no other thread of the
    worker, its reader of the supervisor's frames included, runs meanwhile."""
    started = time.perf_counter()
    sum(range(10**6))
    per_million = time.perf_counter() - started
    sum(range(int(10**6 * float(job.payload["seconds"]) / max(per_million, 1e-6))))
    return {"held": time.perf_counter() - started}


def fail(job: fairsched.Job):
    raise RuntimeError(f"failing on purpose (attempt {job.attempt})")


def fail_permanently(job: fairsched.Job):
    raise fairsched.PermanentError((job.payload or {}).get("why", "this input can never work"))


def record(job: fairsched.Job):
    """Appends the job id to payload['log'] (one line per run): side effects are countable."""
    payload = job.payload or {}
    if payload.get("fail_first") and job.attempt == 1:
        raise RuntimeError("first attempt fails on purpose")
    if payload.get("seconds"):
        time.sleep(float(payload["seconds"]))
    with open(payload["log"], "a") as f:
        f.write(f"{job.id} {job.attempt} {os.getpid()}\n")
    return {"id": job.id}


def _running(pid: int) -> bool:
    """Whether process `pid` exists and has not ended (a zombie waiting to be reaped has)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def span(job: fairsched.Job):
    """Runs payload['seconds'] (ignoring cancel if told to), logging start and end lines to
    payload['log']; returns the earlier runs of the same job still going when it started.
    With payload['child'] it runs a `sleep` beside it meanwhile, logged as a child line."""
    payload = job.payload
    path = Path(payload["log"])
    lines = path.read_text().splitlines() if path.exists() else []
    ended = {tuple(ln.split()[1:3]) for ln in lines if ln.startswith("end ")}
    overlaps = []
    for line in lines:
        word, job_id, pid = line.split()[:3]
        if word == "start" and job_id == str(job.id) and (job_id, pid) not in ended:
            if _running(int(pid)):
                overlaps.append(int(pid))  # that run's process is still alive: it still runs
    child = subprocess.Popen(["sleep", "60"]) if payload.get("child") else None
    with open(path, "a") as f:
        f.write(f"start {job.id} {os.getpid()} {job.attempt}\n")
        if child is not None:
            f.write(f"child {job.id} {child.pid}\n")
    deadline = time.monotonic() + float(payload["seconds"])
    cancelled = False
    while time.monotonic() < deadline and not cancelled:
        cancelled = not payload.get("stubborn") and job.cancelled()
        time.sleep(0.02)
    if child is not None:
        child.kill()
        child.wait()
    with open(path, "a") as f:
        f.write(f"end {job.id} {os.getpid()}\n")
    return {"overlaps": overlaps, "pid": os.getpid(), "cancelled": cancelled}


def awkward(job: fairsched.Job):
    """Returns (payload {"do": "result"}) or raises ("error") text PostgreSQL cannot take as is."""
    do = (job.payload or {}).get("do")
    if do == "result":
        return {"text": "a broken \ud800 pair"}
    if do == "error":
        raise RuntimeError("a broken \ud800 pair and a NUL \x00")
    return {"ok": job.id}


def big(job: fairsched.Job):
    """Sleeps payload['seconds'], then returns a result of about payload['size'] bytes."""
    time.sleep(float(job.payload.get("seconds", 0)))
    return {"id": job.id, "blob": "x" * int(job.payload["size"])}


def chatty(job: fairsched.Job):
    """Reports progress payload['n'] times, as fast as it can, then returns how many."""
    n = int(job.payload["n"])
    for i in range(n):
        job.progress(i / n, f"step {i} of {n}: " + "x" * 80)
    return {"steps": n}


def says(job: fairsched.Job):
    """Reports progress with payload['message'], then waits (up to 30 s) to be cancelled."""
    job.progress(0.5, job.payload["message"])
    deadline = time.monotonic() + 30
    while not job.cancelled() and time.monotonic() < deadline:
        time.sleep(0.02)


def flaky_once(job: fairsched.Job):
    """Its first attempt works payload['seconds'] and fails; later ones succeed."""
    if job.attempt == 1:
        time.sleep(float(job.payload["seconds"]))
        raise RuntimeError("the first attempt fails on purpose")
    return {"attempt": job.attempt}


def leaves_orphans(job: fairsched.Job):
    """Leaves payload['n'] short `sleep`s running in the background, as `cmd &` does."""
    for _ in range(int(job.payload["n"])):
        subprocess.run(["sh", "-c", "sleep 0.2 &"], check=True)
    return {"left": job.payload["n"]}


def exits(job: fairsched.Job):
    """Ends its worker process with status payload['code'], mid-job; without one, returns its
    pid."""
    if job.payload and "code" in job.payload:
        os._exit(int(job.payload["code"]))
    return {"pid": os.getpid()}


def fail_later(job: fairsched.Job):
    """Works payload['seconds'] (or until the file payload['open'] exists, which the test
    creates) without asking job.cancelled(), then fails: for good when payload['permanent']."""
    if "open" in job.payload:
        while not Path(job.payload["open"]).exists():
            time.sleep(0.02)
    else:
        time.sleep(float(job.payload["seconds"]))
    if job.payload.get("permanent"):
        raise fairsched.PermanentError("this input can never work (found late)")
    raise RuntimeError("failed late")


async def _render(job: fairsched.Job):
    await asyncio.sleep(0.01)
    if (job.payload or {}).get("fail"):
        raise fairsched.PermanentError("the awaited call failed")
    return {"rendered": job.payload, "pid": os.getpid()}


def wraps_async(job: fairsched.Job):
    """A plain function that returns an `async def` function's call instead of its result."""
    return _render(job)


def exits_politely(job: fairsched.Job):
    """Calls sys.exit() (with payload['code'] when there is one), or returns its pid."""
    if job.payload and "code" in job.payload:
        sys.exit(job.payload["code"])
    return {"pid": os.getpid()}


def environment_sizes(job: fairsched.Job):
    """Whether this worker was forked from its template (which froze its objects), and the
    lengths of the environment variables payload['names']."""
    return {"forked": gc.get_freeze_count() > 0,
            "sizes": [len(os.environ.get(name, "")) for name in job.payload["names"]]}


def closes_its_channel(job: fairsched.Job):
    """Closes the worker's socket to the supervisor (fd 3), as a handler tidying up every
    descriptor above 2 does."""
    os.close(int(os.environ["FAIRSCHED_FD"]))
    return {}


def rewrites_its_job(job: fairsched.Job):
    """Assigns payload['field'] of its job (as `job.id = str(job.id)` would), or, with no
    payload, returns its pid; then reports progress and returns."""
    if not job.payload:
        return {"pid": os.getpid()}
    setattr(job, job.payload["field"], job.payload["value"])
    job.progress(0.5, "rewrote it")
    return {"done": True}


_kept = []


def closes_standard_streams(job: fairsched.Job):
    """With payload['close'], closes fds 0-2 (as a careless daemonising library does); with
    payload['file'], opens that file, keeps it open, writes a line to it and raises."""
    if job.payload.get("close"):
        for fd in (0, 1, 2):
            os.close(fd)
        return {"closed": True}
    data = open(job.payload["file"], "w")  # noqa: SIM115 (kept open, as a handler's cache is)
    _kept.append(data)
    data.write("data\n")
    data.flush()
    print("said by the handler")
    raise ValueError("failed after opening a file")


def runs_a_shell(job: fairsched.Job):
    """Runs payload['command'] with os.system, which passes on every inheritable descriptor."""
    return {"status": os.system(job.payload["command"]), "pid": os.getpid()}


class _Unclosable:
    """A stream whose `closed` cannot be read, writing to the worker's standard output."""

    @property
    def closed(self):
        raise RuntimeError("no such thing here")

    def write(self, text):
        return sys.__stdout__.write(text)

    def flush(self):
        sys.__stdout__.flush()


def redirects_its_output(job: fairsched.Job):
    """With payload['file'], prints into that file through sys.stdout and sys.stderr, and
    leaves them on it once closed (a redirection never undone); with payload['odd'], puts
    in sys.stdout a stream that cannot say whether it is closed; else prints and returns."""
    if job.payload and job.payload.get("odd"):
        sys.stdout = _Unclosable()
        return {"replaced": True}
    if job.payload and "file" in job.payload:
        with open(job.payload["file"], "w") as sys.stdout:
            sys.stderr = sys.stdout
            print("into the file")
        return {"redirected": True}
    print("said by the next job")
    print("warned by the next job", file=sys.stderr)
    return {"pid": os.getpid()}


def _double(job: fairsched.Job):
    job.progress(0.5, "from a pool process")  # goes nowhere: only the worker reports
    return {"doubled": job.payload["n"] * 2, "id": job.id, "cancelled": job.cancelled()}


def hands_its_job_to_a_pool(job: fairsched.Job):
    """Gives the job itself to a process pool's task, which reads its fields."""
    import concurrent.futures
    import multiprocessing

    context = multiprocessing.get_context(job.payload["start"])
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(_double, job).result()


def prints_much(job: fairsched.Job):
    """Prints payload['lines'] lines to standard output and as many to standard error."""
    for n in range(job.payload["lines"]):
        print("out", n, "." * 100)
        print("err", n, "." * 100, file=sys.stderr)
    return {"printed": job.payload["lines"], "pid": os.getpid()}


def returns(job: fairsched.Job):
    """Returns the JSON value written as text in payload['json']: one a payload cannot hold
    (a NUL character, a lone surrogate) reaches the handler so."""
    return json.loads(job.payload["json"])


KEPT: list[bytes] = []  # what `leak` holds on to, for the life of its process


def leak(job: fairsched.Job):
    """Keeps payload['mb'] megabytes (touched, so resident) for as long as the process lives,
    as a leaking PDF library does, then takes payload['seconds'] more; returns its pid and its
    resident memory at the end."""
    KEPT.append(b"\x01" * (int(job.payload["mb"]) << 20))
    time.sleep(float(job.payload.get("seconds", 0)))  # the rest of the job's work
    return {"pid": os.getpid(), "rss": psutil.Process().memory_info().rss}


_pid_noted = None  # the process that wrote its pid to payload['pids'] (not the template)


def _note_pid(path: str) -> None:
    global _pid_noted
    if _pid_noted != os.getpid():
        _pid_noted = os.getpid()
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")


def tx_row(job: fairsched.Job):
    """Inserts its job's row into tx_rows inside job.transaction(), then waits
    payload['seconds'] there; notes its pid in payload['pids'] (one line per process). With
    payload['fail_first'], its first attempt raises inside the block, after the insert; with
    payload['after'], it sleeps that long once committed."""
    payload = job.payload
    _note_pid(payload["pids"])
    with job.transaction() as conn:
        conn.execute("INSERT INTO tx_rows (job_id, attempt) VALUES (%s, %s)",
                     (str(job.id), job.attempt))
        if payload.get("fail_first") and job.attempt == 1:
            raise RuntimeError("first attempt fails inside the block")
        time.sleep(payload.get("seconds", 0))
    time.sleep(payload.get("after", 0))


_own = None  # plain_row's connections, one per slot's thread


def plain_row(job: fairsched.Job):
    """tx_row without job.transaction(): the row goes in on a connection of the handler's own
    (committed at once), and the job's success is written later by its supervisor."""
    import threading

    import psycopg

    global _own
    payload = job.payload
    _note_pid(payload["pids"])
    if _own is None:
        _own = threading.local()
    if getattr(_own, "conn", None) is None or _own.conn.closed:
        _own.conn = psycopg.connect(os.environ["FAIRSCHED_QUEUE_DATABASE"], autocommit=True)
    _own.conn.execute("INSERT INTO tx_rows (job_id, attempt) VALUES (%s, %s)",
                      (str(job.id), job.attempt))
    time.sleep(payload.get("seconds", 0))


def gate(job: fairsched.Job):
    """Runs until the file payload['open'] exists (the test creates it), or it is cancelled."""
    path = Path(job.payload["open"])
    while not path.exists():
        if job.cancelled():
            return {"cancelled": True}
        time.sleep(0.02)
    return {"opened": job.payload["open"]}


def until_fixed(job: fairsched.Job):
    """Fails for good with payload['why'] until the file payload['fixed'] exists."""
    if not Path(job.payload["fixed"]).exists():
        raise fairsched.PermanentError(job.payload.get("why", "not fixed yet"))
    return {"fixed": True}


def interval(job: fairsched.Job):
    """Sleeps payload['seconds'] and returns when it started and ended (epoch seconds): how
    many ran at once can be read from the results."""
    start = time.time()
    time.sleep(float((job.payload or {}).get("seconds", 0.02)))
    return {"start": start, "end": time.time(), "pid": os.getpid()}
