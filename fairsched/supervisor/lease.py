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

log = logging.getLogger("fairsched.supervisor")

CANCEL_AT = 2 / 3  # past the longest gap a slow database makes between heartbeats (queue_link)
KILL_AT = 0.8  # the rest of the lease covers a late timer and the moments a kill takes
WATCHDOG_AT = 0.9
STALL_SEEN = 1.0  # seconds a timer comes late that mean the supervisor itself stalled


class LeaseGuard:
    def __init__(self, sup, lease: float):
        self.sup = sup
        self.lease = lease
        self.fenced = False
        self._cancel_timer: asyncio.TimerHandle | None = None
        self._kill_timer: asyncio.TimerHandle | None = None
        self._cancel_due = 0.0  # loop time the cancel timer is set for
        # The queued jobs running here at the last renewal: those a lease found expired
        # later ran while it ran out, even if they have ended here since.
        self.running_at_renewal: list[int] = []

    def renewed(self, sent_at: float) -> None:
        """A heartbeat (or registration) sent at loop time `sent_at` succeeded."""
        loop = self.sup.loop
        self.sup.watchdog.lease(sent_at + self.lease * WATCHDOG_AT)
        self.running_at_renewal = sorted(
            rj.job_id for rj in self.sup.running.values() if rj.request is None)
        self._cancel_timers()
        self._cancel_due = sent_at + self.lease * CANCEL_AT
        self._cancel_timer = loop.call_at(self._cancel_due, self._running_out)
        self._kill_timer = loop.call_at(sent_at + self.lease * KILL_AT, self._kill_stragglers)
        if self.fenced:
            self.fenced = False
            log.warning("lease renewed: claiming queued jobs again")
            self.sup.schedule()

    def expired(self, lost: set[int] | None = None) -> None:
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

    def _running_out(self, expired: bool = False, lost: set[int] | None = None) -> None:
        self._cancel_timer = None
        if self.sup.shutting_down:
            return
        self.sup.read_pending()  # late after a stall: jobs may have finished meanwhile
        self.fenced = True
        self.sup.waiting.forget()
        if self.sup.watchdog is not None:  # who is busy now, before the watchdog's turn comes
            self.sup.watchdog.refresh()
        jobs = [rj for rj in self.sup.running.values()
                if rj.request is None and (lost is None or rj.job_id in lost)]
        # A timer that comes seconds late says why: the supervisor itself was not running.
        late = 0.0 if expired else self.sup.loop.time() - self._cancel_due
        why = (f" (this supervisor stalled: its timer came {late:.0f} s late; stopped, or "
               f"starved of CPU?)" if late >= STALL_SEEN else "")
        if not jobs:
            if not expired:  # an expired lease has been logged by the caller
                log.warning("could not renew the %g s lease%s: claiming stops until it is "
                            "renewed", self.lease, why)
            return
        log.error("could not renew the %g s lease%s: giving back %d running queued job%s before "
                  "other supervisors take them over; claiming stops until the lease is renewed",
                  self.lease, why, len(jobs), "" if len(jobs) == 1 else "s")
        for rj in jobs:
            self.sup.cancel_job(rj, "lease")

    def _kill_stragglers(self) -> None:
        """Kill the workers still running a job given back; their on-demand jobs run again."""
        self._kill_timer = None
        if not self.fenced or self.sup.shutting_down:
            return
        self.sup.read_pending()
        procs = {rj.proc for rj in self.sup.running.values() if rj.cancel_reason == "lease"}
        for proc in procs:
            log.error("worker %s is still running a job of the expiring lease; killing it",
                      proc.name)
            for rj in self.sup.running.values():
                if rj.proc is proc and rj.request is not None:
                    rj.cancel_reason = "restart"
            # Its slots leave the index now, as with any stop: no on-demand job is placed on
            # them before its exit is read. Restarted at once, not counted as a crash.
            proc.fenced_kill = True
            if proc.kill_reason is None:
                proc.kill_reason = "still running a job of the expiring lease"
            self.sup.stop_worker(proc, kill_now=True)
