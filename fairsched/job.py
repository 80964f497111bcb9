"""The job a handler receives: its fields, progress reports and the cancel flag."""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable
from decimal import Decimal
from typing import Any

MAX_MESSAGE = 4096  # characters of a progress message; longer ones are cut


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
                 "_slot", "_send", "_cancel_requested", "_done", "_stopped")

    id = _fixed("id")
    type = _fixed("type")
    priority = _fixed("priority")
    attempt = _fixed("attempt")
    on_demand = _fixed("on_demand")
    slot = _fixed("slot")

    def __init__(self, id: int | str, type: str, payload: Any = None, priority: int = 0,
                 attempt: int = 1, on_demand: bool = False, *, slot: int = 0,
                 send: Callable[[dict], None] | None = None):
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
