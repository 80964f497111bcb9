"""The job a handler receives: its fields, progress reports, the cancel flag and its
transaction."""

from __future__ import annotations

import contextlib
import math
import numbers
import operator
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from fairsched.store.statements import WORKER_COMPLETE_SQL

MAX_MESSAGE = 4096  # characters of a progress message; longer ones are cut



class ClaimLost(RuntimeError):
    """job.transaction() could not mark its job succeeded: the job is no longer this run's (its
    supervisor's lease expired and it was rescued, maybe runs elsewhere by now). The handler's
    writes were rolled back with it."""


def _fixed(name: str) -> property:
    """A field that says which job (and which run of it) this is: the worker reports the job's
    outcome and frees its slot by them, so a handler may read it but not change it."""
    def refuse(job: Job, value: Any) -> None:
        raise AttributeError(f"a job's {name} cannot be changed (it says which job this is)")
    return property(operator.attrgetter("_" + name), refuse)


class Job:
    """One run of one job, handed to `handler(job)`.

    A Job built directly (as in a handler's unit test) reports progress nowhere and is never
    cancelled unless `_cancel()` is called.
    """

    __slots__ = ("_id", "_type", "payload", "_priority", "_attempt", "_on_demand",
                 "_slot", "_send", "_cancel_requested", "_done", "_stopped", "_claim",
                 "_connection", "_recorded")

    id = _fixed("id")
    type = _fixed("type")
    priority = _fixed("priority")
    attempt = _fixed("attempt")
    on_demand = _fixed("on_demand")
    slot = _fixed("slot")

    def __init__(self, id: int | str, type: str, payload: Any = None, priority: int = 0,
                 attempt: int = 1, on_demand: bool = False, *, slot: int = 0,
                 send: Callable[[dict], None] | None = None, claim: int = 0,
                 connection: Callable[[], Any] | None = None):
        self._id = id
        self._type = type
        self.payload = payload
        self._priority = priority
        self._attempt = attempt
        self._on_demand = on_demand
        self._slot = slot
        self._send = send
        self._cancel_requested = False  # set by the worker's loop thread; a plain flag will do
        self._done = False
        self._stopped = False  # cancelled() said True: what the handler returns is partial
        self._claim = claim  # a queued job's claim number, which transaction() is fenced on
        self._connection = connection  # gives the worker's connection to the queue's database
        self._recorded = False  # transaction() committed the job's success

    def progress(self, fraction: float | None = None, message: str = "") -> None:
        """Report how far the job is (0..1, or None when unknown); shows in `fairsched ps`.

        Any real number goes (a Fraction, a Decimal, a numpy scalar); one a little past the
        range, as `done / total` can be, is clamped into 0..1, and NaN counts as unknown. Only
        what is no number at all raises (TypeError): a mistake in the handler, not in its
        arithmetic. Called in a process the handler forked, it reports nothing: only the
        worker speaks to the supervisor.
        """
        if fraction is not None:
            if isinstance(fraction, bool) or not isinstance(fraction, (numbers.Real, Decimal)):
                raise TypeError(f"progress fraction must be a number or None, got {fraction!r}")
            try:
                fraction = float(fraction)
            except OverflowError:  # an integer or Fraction past any float: far out of range
                fraction = 1.0 if fraction > 0 else 0.0
            except ValueError:  # a signalling NaN Decimal: no more a number than a quiet one
                fraction = math.nan
            fraction = None if math.isnan(fraction) else min(1.0, max(0.0, fraction))
        message = "" if message is None else str(message)[:MAX_MESSAGE]
        if self._send is None or self._done:
            return
        self._send({"t": "progress", "slot": self.slot, "job_id": self.id,
                    "fraction": fraction, "message": message})

    def cancelled(self) -> bool:
        """True once the supervisor asked to cancel this job (or the worker is stopping).

        A handler that saw True and then returns is taken to have stopped early: when the
        supervisor is shutting down (or the worker restarting) the job goes back to the queue
        instead of ending `succeeded`.
        """
        if self._cancel_requested:
            self._stopped = True
        return self._stopped

    @contextlib.contextmanager
    def transaction(self):
        """`with job.transaction() as conn:` a psycopg connection to the queue's database in a
        transaction. When the block ends without an exception it commits, and for a queued
        job the same transaction marks the job succeeded: the writes and the success happen
        together or not at all. An exception in the block rolls everything back and goes on
        up (the attempt fails as usual). If the job is no longer this run's (its claim was
        lost to a rescue), nothing commits and ClaimLost is raised.

        Once committed, the job has succeeded whatever the handler does next: its return
        value is not stored (the row's result is null) and an exception it raises afterwards
        is logged, not retried; a second transaction() raises RuntimeError. An on-demand job
        has no row: its transaction is a plain one, and a retry may run it again.

        The connection is the worker's own, opened on first use and kept for the slot's
        next jobs; use it only inside the block.
        """
        if self._connection is None:
            raise RuntimeError("job.transaction() needs the queue's database: it works in a "
                               "worker started by `fairsched supervise`")
        if self._recorded:
            raise RuntimeError(f"job {self.id!r} committed its transaction already")
        conn = self._connection()
        with conn.transaction():
            yield conn
            if not self.on_demand:
                if conn.execute(WORKER_COMPLETE_SQL, (self.id, self._claim)).fetchone() is None:
                    raise ClaimLost(f"job {self.id!r} is no longer this run's (claim "
                                    f"{self._claim} lost): its transaction was rolled back")
        self._recorded = not self.on_demand

    def _cancel(self) -> None:
        self._cancel_requested = True

    def __reduce__(self):
        """A job given to another process (a process pool's task, say) arrives as a copy with
        the same fields that, like a Job built directly, reports progress nowhere and is never
        cancelled: only the worker speaks to the supervisor."""
        return (_copy, (self.id, self.type, self.payload, self.priority, self.attempt,
                        self.on_demand, self.slot))

    def __repr__(self) -> str:
        return (f"Job(id={self.id!r}, type={self.type!r}, priority={self.priority}, "
                f"attempt={self.attempt}, on_demand={self.on_demand})")


def _copy(id, type, payload, priority, attempt, on_demand, slot) -> Job:
    return Job(id, type, payload, priority, attempt, on_demand, slot=slot)
