"""The handler a Python worker runs: imported once at start from 'package.module:function'
(StartupError says in one line why it cannot be), an `async def` one (or what a plain one
returns to be awaited) run per job in an event loop of its own, and each job's call: the
frame that reports how it went.
"""

from __future__ import annotations

import concurrent.futures
import functools
import importlib
import inspect
import os
import re
import sys
import traceback
from collections.abc import Callable
from typing import Any

from fairsched.errors import PermanentError
from fairsched.job import Job
from fairsched.protocol import MAX_DEPTH, ProtocolError, encode, json_depth
from fairsched.worker import log_streams
from fairsched.worker._linux import reopen_standard_streams
from fairsched.worker.log_streams import log_stream

MAX_ERROR = 65536  # characters of an error text sent back; the log keeps the whole traceback

HANDLER_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")

Handler = Callable[[Job], Any]


class StartupError(Exception):
    """The worker cannot start; the message is the one line an operator needs."""


def load_handler(ref: str | None) -> Handler:
    """Import 'package.module:function'; StartupError says what is wrong in one line."""
    if not ref:
        raise StartupError("FAIRSCHED_HANDLER is not set: no handler to run")
    if not HANDLER_RE.match(ref):
        raise StartupError(f"handler {ref!r} must look like 'package.module:function'")
    module_name, _, func_name = ref.partition(":")
    # The worker's folder (its group's cwd) first, as a script's is, but only now: the
    # worker's own imports are done, so a json.py beside workers.toml is not taken for
    # the standard library's by them.
    folder = os.getcwd()
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except BaseException as exc:  # SystemExit, KeyboardInterrupt too: it could not start
        missing = isinstance(exc, ModuleNotFoundError) and exc.name is not None and (
            module_name == exc.name or module_name.startswith(exc.name + "."))
        if not missing:  # an error inside the module: its traceback shows where
            traceback.print_exc()
        raise StartupError(f"cannot import handler {ref!r}: {describe_exception(exc)}") from None
    try:
        handler = getattr(module, func_name)
    except AttributeError:
        raise StartupError(f"cannot import handler {ref!r}: module {module_name!r} has no "
                           f"attribute {func_name!r}") from None
    except BaseException as exc:  # a module __getattr__ (a lazy attribute) that failed
        traceback.print_exc()
        raise StartupError(f"cannot import handler {ref!r}: getting {func_name!r} from module "
                           f"{module_name!r} raised {describe_exception(exc)}") from None
    if not callable(handler):
        raise StartupError(f"handler {ref!r} is a {type(handler).__name__}, not a function")
    # Shapes that would fail every job they get, said once here instead.
    if inspect.isgeneratorfunction(handler) or inspect.isasyncgenfunction(handler):
        raise StartupError(f"handler {ref!r} is a generator function: it must return its "
                           "result (or be an `async def` that returns it)")
    try:
        signature = inspect.signature(handler)
    except Exception:  # no signature to be had (some builtins, proxies): let the jobs tell
        signature = None
    if signature is not None:
        try:
            signature.bind(None)
        except TypeError:
            raise StartupError(f"handler {ref!r} must take one argument, the job; its "
                               f"signature is {signature}") from None
    if inspect.iscoroutinefunction(handler) or (  # an `async def` (a partial of one too),
            not inspect.isroutine(handler)         # or an object whose __call__ is one
            and inspect.iscoroutinefunction(type(handler).__call__)):
        return _run_coroutine(handler)
    return handler


# Seconds the tasks an async handler leaves running get to end once cancelled, after it has
# returned or raised; what still runs then is left behind, and the job reports all the same.
LEFTOVER_GRACE = 1.0


def _run_coroutine(handler: Callable[[Job], Any]) -> Handler:
    """An `async def` handler, run to its end in an event loop of its own for each job (in
    the job's thread, so that slots stay independent)."""
    @functools.wraps(handler)
    def run(job: Job) -> Any:
        return run_awaitable(lambda: handler(job), job)
    return run


def run_awaitable(make: Callable[[], Any], job: Job) -> Any:
    """Await what `make()` returns (a coroutine, or any awaitable) in an event loop of its own,
    made and tidied as for an `async def` handler; `make` is called inside the loop."""
    import asyncio

    async def main():
        return await make()

    loop = asyncio.new_event_loop()
    executor = _Executor()  # run_in_executor(None, ...) runs here
    loop.set_default_executor(executor)
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(main())
    finally:
        try:
            _tidy_loop(asyncio, loop, executor, job)
        finally:
            asyncio.set_event_loop(None)
            loop.close()


class _Executor(concurrent.futures.ThreadPoolExecutor):
    """A job's default executor, which knows what was given to it."""

    def __init__(self):
        super().__init__(thread_name_prefix="job-executor")
        self.futures: list[concurrent.futures.Future] = []

    def submit(self, fn, /, *args, **kwargs):
        future = super().submit(fn, *args, **kwargs)
        self.futures.append(future)
        return future


def _tidy_loop(asyncio, loop, executor: _Executor, job: Job) -> None:
    """What asyncio.run does once its coroutine is done, short of waiting for ever: a task
    the handler left running that ignores its cancel, an async generator whose cleanup never
    ends, or an executor thread still blocked, would keep the job from ever reporting (and
    its slot taken)."""
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        _, stuck = loop.run_until_complete(asyncio.wait(tasks, timeout=LEFTOVER_GRACE))
        if stuck:
            note(f"job {job.id} ({job.type}): {len(stuck)} task(s) its handler left running "
                 f"did not end within {LEFTOVER_GRACE:g} s of their cancel; left behind")
    # Their cleanup (a `finally` that awaits a connection's close, say) is bounded as well.
    closing = loop.create_task(loop.shutdown_asyncgens())
    _, stuck = loop.run_until_complete(asyncio.wait([closing], timeout=LEFTOVER_GRACE))
    if stuck:
        note(f"job {job.id} ({job.type}): the async generators its handler left open did not "
             f"close within {LEFTOVER_GRACE:g} s; left behind")
    executor.shutdown(wait=False, cancel_futures=True)
    _, busy = concurrent.futures.wait(executor.futures, timeout=LEFTOVER_GRACE)
    if busy:
        note(f"job {job.id} ({job.type}): {len(busy)} thread(s) its handler started "
             f"(run_in_executor) still run; left behind")


def describe_exception(exc: BaseException) -> str:
    """'ExcType: message', as sent in an error frame."""
    try:
        text = str(exc)
    except BaseException:  # a __str__ that raises, even SystemExit: the type is still news
        text = ""
    name = type(exc).__name__
    text = f"{name}: {text}" if text else name
    if isinstance(exc, BaseExceptionGroup):  # what went wrong is in its exceptions
        text += " [" + "; ".join(describe_exception(sub) for sub in exc.exceptions) + "]"
    return text[:MAX_ERROR]


def note(line: str) -> None:
    """A line of the worker's own to its log, stamped with the UTC time to the millisecond,
    so that it can be matched with the supervisor's log (job ids like od-4 start again with
    every supervisor)."""
    try:
        with log_streams.plain():  # it says which job itself
            print(f"{log_streams.stamp()} {line}", file=sys.stderr, flush=True)
    except Exception:  # a full disk, a handler that closed stderr or put in its place what
        pass           # cannot flush: the line is lost, not the job's outcome


# -- one job: call the handler, and the frame that says how it went -----------------------------


def answer(handler: Handler, job: Job) -> bytes:
    """Call the handler; the frame that reports how it went. Never raises: a job thread
    that died here would leave its slot taken and the worker's state lock held."""
    log_streams.job_started(job)  # what this thread prints meanwhile is the job's
    try:
        return _answer(handler, job)
    except BaseException as exc:  # reporting failed (a full disk under the log, say)
        return encode({"t": "error", "slot": job.slot, "job_id": job.id, "permanent": False,
                       "error": "the worker could not report how the job went: "
                                + describe_exception(exc)})
    finally:
        log_streams.job_ended()


def _answer(handler: Handler, job: Job) -> bytes:
    head = {"slot": job.slot, "job_id": job.id}
    try:
        value = handler(job)
        if inspect.isawaitable(value):  # a plain function that returned an async one's call
            awaitable = value
            value = run_awaitable(lambda: awaitable, job)
    except PermanentError as exc:
        if job._recorded:
            return _raised_after_commit(job, head, exc)
        if job._stopped:
            return _stopped_by_raising(job, head, exc)
        note(f"job {job.id} ({job.type}) failed permanently, attempt {job.attempt}:")
        note_traceback()  # where it was raised, and what caused it
        return encode({"t": "error", **head, "error": describe_exception(exc),
                       "permanent": True})
    except BaseException as exc:  # SystemExit too: a handler must not end the worker
        if job._recorded:
            return _raised_after_commit(job, head, exc)
        if job._stopped:
            return _stopped_by_raising(job, head, exc)
        # A group (as asyncio's TaskGroup raises) holding a PermanentError would meet it again.
        permanent = (isinstance(exc, BaseExceptionGroup)
                     and exc.subgroup(PermanentError) is not None)
        note(f"job {job.id} ({job.type}) failed{' permanently' if permanent else ''}, "
             f"attempt {job.attempt}:")
        note_traceback()
        return encode({"t": "error", **head, "error": _describe_failure(exc),
                       "permanent": permanent})
    return _result_frame(job, head, value)


def _describe_failure(exc: BaseException) -> str:
    """A failed job's error: 'ExcType: message', or for sys.exit() what became of it (the
    job failed, the worker goes on), where 'SystemExit: None' would say nothing."""
    if isinstance(exc, SystemExit):
        try:
            code = repr(exc.code)
        except BaseException:
            code = "?"
        return (f"SystemExit: the handler called sys.exit() (code {code}): its job fails, "
                "its worker runs on")[:MAX_ERROR]
    return describe_exception(exc)


def _raised_after_commit(job: Job, head: dict, exc: BaseException) -> bytes:
    """The handler raised after job.transaction() committed the job's success: that stands
    (the table says so already); the error is only logged."""
    note(f"job {job.id} ({job.type}) raised {describe_exception(exc)} after its transaction "
         "committed; the job stays succeeded:")
    note_traceback()
    return encode({"t": "result", **head, "result": None, "recorded": True})


def _stopped_by_raising(job: Job, head: dict, exc: BaseException) -> bytes:
    """The handler saw job.cancelled() and raised to stop: stopped early, as if it had
    returned (asking is what counts); the supervisor knows what that stop costs."""
    note(f"job {job.id} ({job.type}) stopped early on a cancel, raising "
         f"{describe_exception(exc)}")
    return _result_frame(job, head, None)


class _Generator(Exception):
    """What a handler with a yield in it returns: no result, however it would encode."""


def _result_frame(job: Job, head: dict, value: Any) -> bytes:
    if job._recorded:  # the row says succeeded already, its result null: this is not stored
        return encode({"t": "result", **head, "result": None, "recorded": True})
    if job._stopped:
        head = {**head, "stopped": True}
    try:
        if inspect.isgenerator(value) or inspect.isasyncgen(value):
            raise _Generator("an async generator" if inspect.isasyncgen(value) else "a generator")
        data = encode({"t": "result", **head, "result": value})
    except _Generator as exc:
        error = f"the handler returned {exc} (a yield in it?): it must return its result"
    except ProtocolError as exc:
        error = f"result is too large: {exc}"
    except Exception as exc:  # TypeError mostly; whatever a strange object's methods raise
        error = f"result is not JSON-serialisable: {describe_exception(exc)}"
    else:  # the supervisor reads no deeper than it sends payloads
        if len(data) <= 2 * MAX_DEPTH or json_depth(data[4:].decode()) <= MAX_DEPTH:
            return data
        error = f"result nests deeper than {MAX_DEPTH - 1} levels"
    if job._stopped:  # what a job that stopped early returns is not kept: its stop counts
        note(f"job {job.id} ({job.type}) stopped early on a cancel; what it returned is "
             f"dropped ({error})")
        return encode({"t": "result", **head, "result": None})
    note(f"job {job.id} ({job.type}) failed permanently: {error}")
    return encode({"t": "error", **head, "error": error, "permanent": True})


def keep_log() -> int | None:
    """A descriptor of the worker's log (its standard error) of the worker's own, to put the
    standard streams back on should a handler close them."""
    try:
        fd = os.dup(2)  # not inherited by what a handler runs (PEP 446)
    except OSError:
        return None
    log_streams.keep(fd)  # on the log as it rotates
    return fd


def reopen_print_streams() -> dict[str, int]:
    """Put sys.stdout and sys.stderr back on fds 1 and 2 where a handler left them closed (or
    None): a redirection into a file, never undone, would fail every later print. Returns
    {name: fd} for those put back."""
    put_back = {}
    for fd, name in ((1, "stdout"), (2, "stderr")):
        try:
            if not _closed(getattr(sys, name)):
                continue
            original = getattr(sys, f"__{name}__")
            if _closed(original):
                original = log_stream(fd)
        except Exception:  # a stream of the handler's that cannot even say: left as it is
            continue
        setattr(sys, name, original)
        put_back[f"sys.{name}"] = fd
    return put_back


def _closed(stream) -> bool:
    return stream is None or getattr(stream, "closed", False) is True


def restore_streams(log: int | None) -> list[str]:
    """The standard streams a handler closed, opened again; what was done, said as the end
    of a log line that starts with the job."""
    said = []
    reopened = reopen_standard_streams(log)
    if reopened:
        places: dict[str, list[str]] = {}
        for fd, place in reopened.items():
            places.setdefault(place, []).append(str(fd))
        where = ", ".join(f"{' and '.join(fds)} on {place}" for place, fds in places.items())
        said.append(f"closed fd {', '.join(map(str, reopened))}; opened again ({where})")
    put_back = reopen_print_streams()
    if put_back:
        said.append(f"left {', '.join(put_back)} closed; put back on fd "
                    f"{', '.join(map(str, put_back.values()))}")
    return said


def note_traceback() -> None:
    """The traceback of the exception being handled, to the log, under the line note() wrote
    about it."""
    try:
        with log_streams.plain():
            traceback.print_exc()
    except Exception:  # as in note()
        pass
