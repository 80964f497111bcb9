"""Self-fencing: a supervisor that cannot renew its lease stops its queued jobs before the
other supervisors may take them over, so no job ever runs in two places at once.

Other supervisors rescue this one's running jobs once its heartbeat is older than `lease`. If
this supervisor cannot heartbeat (the database or the network to it is gone, or a statement
hangs), its workers would go on running those jobs while a rescuer starts them again. So,
counting from the moment the last successful heartbeat was sent:

- at CANCEL_AT of the lease it cancels its running queued jobs (they go back to the queue,
  their attempt not spent) and claims nothing more; on-demand jobs are not in the table and
  keep running;
- at KILL_AT of the lease it kills the workers still running one of those jobs;
- a renewed lease lifts the fence: claiming starts again.

All of that needs a running event loop. A supervisor that is itself stalled (stopped,
swapping) cannot fence, so every renewal also goes to the lease watchdog (watchdog.py), a
process of its own that kills the workers still running queued jobs at WATCHDOG_AT of the lease.
The rest of the lease covers the moments a kill takes.
"""

from __future__ import annotations

import asyncio
import logging

from fairsched.logs import some_ids

log = logging.getLogger("fairsched.supervisor")

CANCEL_AT = 2 / 3  # past the longest gap a slow database makes between heartbeats (queue_link)
KILL_AT = 0.8  # the rest of the lease covers a late timer and the moments a kill takes
WATCHDOG_AT = 0.9
STALL_SEEN = 1.0  # seconds a timer comes late that mean the supervisor itself stalled


class LeaseGuard:
    """Owns the lease's timers and whether this supervisor is fenced. What fencing does to the
    jobs and workers is the actor's: at CANCEL_AT it calls `running_out(expired, lost, late)`,
    at KILL_AT `kill_due()` (when still fenced)."""

    def __init__(self, loop, run, lease: float, running_out, kill_due):
        self.loop = loop
        self.run = run  # RunState: the actor's, read only
        self.lease = lease
        self._running_out_cb = running_out
        self._kill_due_cb = kill_due
        self.fenced = False
        self._cancel_timer: asyncio.TimerHandle | None = None
        self._kill_timer: asyncio.TimerHandle | None = None
        self._cancel_due = 0.0  # loop time the cancel timer is set for
        # The queued jobs running here at the last renewal: those a lease found expired
        # later ran while it ran out, even if they have ended here since.
        self.running_at_renewal: list[int] = []

    def renewed(self, sent_at: float, running_queued: list[int]) -> bool:
        """A heartbeat (or registration) sent at loop time `sent_at` succeeded, with the
        queued jobs `running_queued` running here; whether that lifted the fence."""
        self.running_at_renewal = sorted(running_queued)
        self._cancel_timers()
        self._cancel_due = sent_at + self.lease * CANCEL_AT
        self._cancel_timer = self.loop.call_at(self._cancel_due, self._running_out)
        self._kill_timer = self.loop.call_at(sent_at + self.lease * KILL_AT,
                                             self._kill_stragglers)
        if not self.fenced:
            return False
        self.fenced = False
        log.warning("lease renewed: claiming queued jobs again")
        return True

    def fence(self) -> None:
        """Claim nothing more until the lease is renewed."""
        self.fenced = True

    def expired(self, lost: frozenset[int] | None = None) -> None:
        """The lease had already run out: the jobs (those of `lost`, or all) may be running
        elsewhere now."""
        self._cancel_timers()
        self._running_out(expired=True, lost=lost)
        self._kill_stragglers()

    def stop(self) -> None:
        self._cancel_timers()

    def _cancel_timers(self) -> None:
        for timer in (self._cancel_timer, self._kill_timer):
            if timer is not None:
                timer.cancel()
        self._cancel_timer = self._kill_timer = None

    def _running_out(self, expired: bool = False, lost: frozenset[int] | None = None) -> None:
        self._cancel_timer = None
        if self.run.shutting_down:
            return
        # A timer that comes seconds late says why: the supervisor itself was not running.
        late = 0.0 if expired else self.loop.time() - self._cancel_due
        self._running_out_cb(expired, lost, late)

    def _kill_stragglers(self) -> None:
        self._kill_timer = None
        if self.fenced and not self.run.shutting_down:
            self._kill_due_cb()

    def said_running_out(self, late: float, jobs: int, expired: bool) -> None:
        """Log that the lease could not be renewed, with `jobs` queued jobs to give back."""
        why = (f" (this supervisor stalled: its timer came {late:.0f} s late; stopped, or "
               f"starved of CPU?)" if late >= STALL_SEEN else "")
        if not jobs:
            if not expired:  # an expired lease has been logged by the caller
                log.warning("could not renew the %g s lease%s: claiming stops until it is "
                            "renewed", self.lease, why)
            return
        log.error("could not renew the %g s lease%s: giving back %d running queued job%s before "
                  "other supervisors take them over; claiming stops until the lease is renewed",
                  self.lease, why, jobs, "" if jobs == 1 else "s")

    def said_expired_idle(self) -> None:
        """The lease found expired with no queued job running here now: whether some ran while
        it ran out (the lease watchdog may have killed their workers, or they ended meanwhile)."""
        ran = self.running_at_renewal
        if not ran:
            what = "this supervisor's lease had expired while no job of the queue ran here"
        else:
            what = (f"this supervisor's lease had expired while {len(ran)} of its queued "
                    f"job{'' if len(ran) == 1 else 's'} ran here ({some_ids(ran)}; ended here "
                    f"since)")
        log.warning("%s: registered again", what)
