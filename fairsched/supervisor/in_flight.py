"""Records the actor keeps for work in flight: on-demand requests, claims and running jobs."""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Request:
    """An on-demand request: lives in memory while its caller waits on the control socket."""

    number: int
    type: str
    type_id: int
    payload_json: str  # the payload as JSON text (protocol.payload_json)
    priority: int
    max_attempts: int
    notify: Callable[[dict], None]  # sends an event line to the waiting caller
    eligible_at: float = field(default_factory=time.time)
    attempts: int = 0
    done: bool = False
    cancelled: bool = False
    hold: int | None = None  # [limits]: its place in fairsched_limit_holds while it runs

    @property
    def job_id(self) -> str:
        return f"od-{self.number}"

    @property
    def core_id(self) -> int:
        # On-demand ids are negative inside the core so they never collide with queued ids.
        return -self.number


class Claims:
    """Queued jobs reserved by the actor and their slots, in the order planned: an array of
    job ids beside one of slot ids, as the core's plan gives them, so a cycle hands over a
    thousand claims without making an object for each. Iterating gives (job_id, slot_id)."""

    __slots__ = ("job_ids", "slot_ids")

    def __init__(self, job_ids=(), slot_ids=()):
        self.job_ids = array("q", job_ids)
        self.slot_ids = array("q", slot_ids)

    def extend(self, job_ids, slot_ids) -> None:
        self.job_ids.extend(job_ids)
        self.slot_ids.extend(slot_ids)

    def ids(self) -> list[int]:
        return self.job_ids.tolist()

    def __len__(self) -> int:
        return len(self.job_ids)

    def __iter__(self):
        return zip(self.job_ids, self.slot_ids, strict=True)


@dataclass(eq=False)
class RunningJob:
    job_id: int | str
    type: str
    priority: int
    payload_json: str  # JSON text, framed as it is
    attempt: int
    max_attempts: int
    proc: Any
    slot_id: int
    slot_index: int
    eligible_at: float
    claim: int = 0  # a queued job's claim number, which its outcome is fenced on
    request: Request | None = None
    started_mono: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)
    progress: float | None = None
    message: str = ""
    cancel_reason: str | None = None  # "user", "shutdown", "restart", "caller", "lease"
    failure: str | None = None  # why the worker was killed under this job (timeout)
    failure_final: bool = False  # `failure` ends the job for good (on_timeout = "fail")
    timer: Any = None  # its timeout
    cancel_timer: Any = None  # cancel_grace after a user's cancel

    @property
    def on_demand(self) -> bool:
        return self.request is not None
