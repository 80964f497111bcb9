"""The workers' pipes: frames out in batches, frames in, each message handed to whoever acts on
it (a hello to the workers, a job's progress or outcome to the jobs). Owned by the workers
component (workers.py)."""

from __future__ import annotations

import logging
import signal

from fairsched.logs import quoted
from fairsched.protocol import (
    READ_SIZE,
    WORKER_MESSAGES,
    FrameDecoder,
    IncompatibleProtocol,
    ProtocolError,
    encode,
    validate,
)
from fairsched.supervisor.process import WorkerProcess
from fairsched.supervisor.states import ProcessState

EXIT_GRACE = 2.0  # a worker that closed its pipe gets this long to exit before SIGKILL

log = logging.getLogger("fairsched.supervisor")


class Pipes:
    """Owns each worker's reading and writing on the loop, the read buffer every worker's reads
    share, and the workers with frames waiting for the end of a cycle."""

    def __init__(self, workers, jobs, planner, loop, run, log_dir):
        self.workers = workers
        self.jobs = jobs
        self.planner = planner
        self.loop = loop
        self.run = run  # RunState: the actor's, read only
        self.log_dir = log_dir
        self._unflushed: set[WorkerProcess] = set()
        self._read_buffer = memoryview(bytearray(READ_SIZE))  # every worker's reads, one at a time

    def attach(self, proc: WorkerProcess, sock) -> None:
        """A new incarnation's pipe: read from now on."""
        proc.life.sock = sock
        sock.setblocking(False)
        proc.life.decoder = FrameDecoder(accept=WORKER_MESSAGES)
        proc.life.outbox = bytearray()
        proc.life.writing = False
        self.loop.add_reader(sock.fileno(), self._on_readable, proc)

    def drop(self, proc: WorkerProcess) -> None:
        """Let go of the worker's pipe (it is gone, or relaunched)."""
        if proc.life.sock is not None:
            fd = proc.life.sock.fileno()
            self.loop.remove_reader(fd)
            self.loop.remove_writer(fd)
            proc.life.sock.close()
            proc.life.sock = None
        proc.life.writing = False
        self._unflushed.discard(proc)

    def send(self, proc: WorkerProcess, msg: dict | bytes, *, defer: bool = False) -> bool:
        """Frame `msg` (or send a frame already encoded) to the worker; with defer, it leaves
        with the cycle's other frames."""
        if proc.life.sock is None or proc.life.write_failed:
            return False
        proc.life.outbox += msg if isinstance(msg, bytes) else encode(msg)
        if defer:
            self._unflushed.add(proc)
            return True
        return self._flush(proc)

    def _flush(self, proc: WorkerProcess) -> bool:
        if proc.life.sock is None or proc.life.write_failed:
            return False
        if proc.life.writing:  # a partial write is pending: the writer callback carries on
            return True
        try:
            sent = proc.life.sock.send(proc.life.outbox)
        except BlockingIOError:
            sent = 0
        except OSError as exc:  # EPIPE/ECONNRESET: the worker is gone
            self._write_failed(proc, exc)
            return False
        del proc.life.outbox[:sent]
        if proc.life.outbox:
            proc.life.writing = True
            self.loop.add_writer(proc.life.sock.fileno(), self._on_writable, proc)
        return True

    def flush_all(self) -> None:
        if self._unflushed:
            self.workers.flush_watchdog()  # the workers about to get queued jobs are busy first
        while self._unflushed:
            self._flush(self._unflushed.pop())

    def _on_writable(self, proc: WorkerProcess) -> None:
        try:
            sent = proc.life.sock.send(proc.life.outbox)
        except BlockingIOError:
            return
        except OSError as exc:
            self._write_failed(proc, exc)
            return
        del proc.life.outbox[:sent]
        if not proc.life.outbox:
            proc.life.writing = False
            self.loop.remove_writer(proc.life.sock.fileno())

    def _write_failed(self, proc: WorkerProcess, exc: OSError) -> None:
        """The worker is gone (EPIPE) or going: it takes no more work. What it wrote before it
        went still counts (a result that crossed our frame on the wire), so the reader, which
        reads that and then the end of the pipe, drops the worker; or, if that end has not
        come EXIT_GRACE later (a worker that shut down only its reading side), this does."""
        if proc.life.writing:
            self.loop.remove_writer(proc.life.sock.fileno())
            proc.life.writing = False
        proc.life.outbox.clear()
        proc.life.write_failed = f"worker {proc.name} pipe closed ({exc.strerror})"
        self.planner.close_slots(proc.life.generation)  # its running jobs keep their slots' ids
        self.loop.call_later(EXIT_GRACE, self._drop_after_grace, proc, proc.life.name)

    def _drop_after_grace(self, proc: WorkerProcess, incarnation: str) -> None:
        if proc.life.name == incarnation and proc.life.sock is not None:
            self.workers.unregister_worker(proc, proc.life.write_failed)
            self.workers.expect_exit(proc)

    def read_pending(self, procs) -> None:
        """Read all that the workers `procs` have written so far: what finished while this
        supervisor was stalled counts before it acts on the stall."""
        for proc in procs:
            while proc.life.sock is not None and self._on_readable(proc):
                pass

    def _on_readable(self, proc: WorkerProcess) -> bool:
        """Read from the worker once and act on it; whether there was anything to read."""
        sock = proc.life.sock
        try:
            size = sock.recv_into(self._read_buffer)
        except BlockingIOError:
            return False
        except OSError:
            size = 0
        if not size:
            if proc.life.decoder.pending:
                log.warning("worker %s closed its pipe in the middle of a frame (%d bytes of it "
                            "came)", proc.name, proc.life.decoder.pending)
            self.workers.killed_by_watchdog(proc)
            if not self.workers.reap_worker(proc):  # exited: its jobs learn how (a signal, a code)
                self.workers.pipe_closed(proc)
            return True
        self._take(proc, sock, size)
        return True

    def read_last_words(self, proc: WorkerProcess) -> None:
        """Act on all an exited worker wrote before it went, so that a result it sent is its
        job's outcome and not a crash: its exit can be reaped (SIGCHLD) before its last
        frames are read."""
        sock = proc.life.sock
        while sock is not None and proc.life.sock is sock:
            try:
                size = sock.recv_into(self._read_buffer)
            except OSError:  # BlockingIOError: nothing more; a reset: nothing at all
                return
            if not size:
                return
            self._take(proc, sock, size)

    def _take(self, proc: WorkerProcess, sock, size: int) -> None:
        """Decode and act on `size` bytes read from the worker's socket `sock`."""
        try:
            broken = None
            try:
                messages = proc.life.decoder.feed(self._read_buffer[:size])
            except ProtocolError as exc:  # what came ahead of the bad frame counts first
                messages, broken = exc.before, exc
            for msg in messages:
                validate(msg)
                self.handle_message(proc, msg)
                if proc.life.sock is not sock:  # dropped, perhaps restarted: the rest was its own
                    return
            if broken is not None:
                raise broken
        except IncompatibleProtocol as exc:  # no restart will change it: fatal once it exits
            log.error("worker %s cannot work with this supervisor: %s; killing it", proc.name, exc)
            proc.life.incompatible = str(exc)
            proc.life.kill_reason = f"it speaks another protocol version: {exc}"
            self.workers.kill_worker(proc, signal.SIGKILL)
            self.workers.unregister_worker(proc, f"worker {proc.name}: {exc}")
        except ProtocolError as exc:
            log.error("worker %s sent a bad frame: %s; killing it", proc.name, exc)
            proc.life.kill_reason = f"it sent a bad frame: {exc}"
            self.workers.kill_worker(proc, signal.SIGKILL)
            self.workers.unregister_worker(proc, f"worker {proc.name} sent a bad frame: {exc}")

    def handle_message(self, proc: WorkerProcess, msg: dict) -> None:
        kind = msg["t"]
        if kind == "hello":
            self.workers.register_worker(proc, msg)
            return
        if kind == "fatal":
            proc.life.said_fatal = quoted(msg["error"])
            log.error("worker %s %s: %s", proc.name,
                      "gave up" if proc.life.slot_ids else "cannot start", proc.life.said_fatal)
            return
        if not proc.life.slot_ids:
            raise ProtocolError(f"{kind!r} before hello")
        slot = msg["slot"]
        rj = self.jobs.on_slot(proc.life.slot_ids[slot]) if 0 <= slot < len(proc.life.slot_ids) else None
        if rj is None or rj.job_id != msg["job_id"]:
            self._not_running_there(proc, msg, rj)
            return
        if isinstance(msg.get("log_lost"), str) and not proc.life.warned_log_lost:
            proc.life.warned_log_lost = True
            log.warning("worker %s cannot write to its log %s: %s; what its jobs print is lost "
                        "until there is room (said once per process)", proc.name,
                        self.log_dir / f"{proc.name}.log", quoted(msg["log_lost"], 200))
        if kind == "progress":
            self.jobs.progress(rj, *self._progress_fields(proc, msg))
        elif kind == "result":
            # "recorded": the job's transaction marked it succeeded (queued jobs only: what an
            # on-demand job's says is a plain transaction's). That holds however it stopped.
            recorded = msg.get("recorded") is True and rj.request is None
            outcome = "stopped" if msg.get("stopped") is True and not recorded else "succeeded"
            self.jobs.finish_job(rj, outcome, result=msg.get("result"), recorded=recorded)
        elif kind == "error":
            error = msg["error"].strip() or f"worker {proc.name} reported an error without a message"
            self.jobs.finish_job(rj, "failed", error=error, permanent=bool(msg.get("permanent")))
        elif kind == "refused":
            reason = quoted(msg["reason"])
            log.error("worker %s refused job %s: %s", proc.name, rj.job_id, reason)
            if proc.state is not ProcessState.STOPPING and not self.run.shutting_down:
                # Stopping (told so by someone else) or out of step with us: either way its
                # slots must take no more work, or the job would bounce back and forth.
                log.warning("worker %s refuses work; restarting it", proc.name)
                proc.life.refused_work = True  # counted as a crash: a worker that always refuses
                self.jobs.spare_jobs_beside(rj)  # backs off and ends fatal; its other jobs
                self.workers.stop_worker(proc)   # are not to pay for it
            self.jobs.finish_job(rj, "refused", error=f"refused by {proc.name}: {reason}")

    def _not_running_there(self, proc: WorkerProcess, msg: dict, rj) -> None:
        """A message for a job its slot is not running. A late progress is let go (with one
        warning per process, however many come); an outcome for another job than the one
        running there means the worker is out of step (the job would keep its slot forever):
        a protocol error."""
        kind, job_id, slot = msg["t"], quoted(repr(msg["job_id"]), 100), msg["slot"]
        hint = ""
        if rj is not None and str(msg["job_id"]) == str(rj.job_id):
            hint = " (a job id goes back exactly as it came: a number as a number, a string as a string)"
        if rj is None or kind == "progress":
            if proc.life.warned_stale:  # a worker that keeps at it must not flood the log
                return
            proc.life.warned_stale = True
            running = "which is not running there" if rj is None else f"which runs job {rj.job_id!r}"
            log.warning("worker %s sent %s for job %s on slot %s, %s%s; ignored (said once per "
                        "process)", proc.name, kind, job_id, slot, running, hint)
            return
        raise ProtocolError(f"{kind} for job {job_id} on slot {slot}, which runs job "
                            f"{rj.job_id!r}{hint}")

    def _progress_fields(self, proc: WorkerProcess, msg: dict) -> tuple[float | None, str]:
        """A progress message's fraction (clamped into 0..1) and text; fields of the wrong type
        only cost the progress shown, with one warning per worker process."""
        fraction, message = msg.get("fraction"), msg.get("message", "")
        wrong = []
        if fraction is not None and (isinstance(fraction, bool)
                                     or not isinstance(fraction, int | float)):
            wrong.append(f"'fraction' is {fraction!r}, not a number or null")
            fraction = None
        elif fraction is not None:
            # Clamped before it is made a float, which an integer past any double (10**400,
            # valid JSON) cannot be.
            fraction = float(min(1, max(0, fraction)))
        if not isinstance(message, str):
            wrong.append(f"'message' is {quoted(repr(message), 100)}, not a string")
            message = ""
        if wrong and not proc.life.warned_progress:
            proc.life.warned_progress = True
            log.warning("worker %s sent progress with %s; ignored (said once per process)",
                        proc.name, " and ".join(wrong))
        return fraction, quoted(message)  # shown in ps, sent to the caller: a line, not a book
