"""What the queue link tells the actor: one small record per fact, handled in one place
(Supervisor.handle). The link holds no reference to the actor; it posts these, on the loop."""

from __future__ import annotations

from dataclasses import dataclass, field

from fairsched.supervisor.in_flight import Claims


@dataclass(frozen=True, slots=True)
class Connected:
    """The claim lane (re)connected: plan with what it will find."""


@dataclass(frozen=True, slots=True)
class Disconnected:
    """The claim lane lost the database: plan without it (waiting on-demand requests run)."""


@dataclass(frozen=True, slots=True)
class LeaseRenewed:
    sent_at: float  # loop time the heartbeat (or registration) was sent


@dataclass(frozen=True, slots=True)
class LeaseExpired:
    """This supervisor's lease had run out: the jobs of `lost` (None: all) may run elsewhere."""
    lost: frozenset | None
    idle: bool = False  # no queued job ran here when it was found out


@dataclass(frozen=True, slots=True)
class Stale:
    """What is known of the queue may be stale (a poll, a lost notification): look afresh."""


@dataclass(frozen=True, slots=True)
class FetchBegan:
    pass


@dataclass(frozen=True, slots=True)
class Fetched:
    rows: list
    wanted: dict  # free slots by type, as asked


@dataclass(frozen=True, slots=True)
class Backlog:
    counts: dict  # by type, jobs waiting for GROW_WAIT or more (capped as asked)


@dataclass(frozen=True, slots=True)
class Claimed:
    claims: Claims
    won: dict  # the jobs won, by id
    contested: bool = True  # False: the claim never reached the database
    refused: dict = field(default_factory=dict)  # [limits]: ids left at their type's limit


@dataclass(frozen=True, slots=True)
class Held:
    """[limits]: the answer to an on-demand request's hold on a place of its type."""

    request: object
    slot_id: int
    hold: int | None  # None: the type was at its limit


@dataclass(frozen=True, slots=True)
class NextDue:
    delay: float  # seconds until the next delayed job or retry comes due


@dataclass(frozen=True, slots=True)
class JobsNotified:
    type_name: str


@dataclass(frozen=True, slots=True)
class CancelRequested:
    job_id: object  # as notified: a job id, or text that may not be one


@dataclass(frozen=True, slots=True)
class OutcomeUnrecorded:
    job_type: str
    outcome: str
