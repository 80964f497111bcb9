"""The claim lane's heartbeat: renewing this supervisor's lease, judging the others by theirs
and returning the jobs of those found dead, and squaring the job table with what runs here.

The base of QueueLink (queue_link.py), whose state it reads: the store, the settings, the
outbox and the lane's clocks; what it finds goes to the actor as messages.
"""

from __future__ import annotations

import asyncio
import logging
import math

from fairsched.logs import plural, some_ids
from fairsched.store.aqueue import AsyncStore
from fairsched.supervisor.messages import CancelRequested, LeaseExpired, LeaseRenewed

log = logging.getLogger("fairsched.queue")


class Heartbeats:
    async def _heartbeat(self, store: AsyncStore, now: float) -> None:
        """Renew the lease; find the supervisors whose lease ran out and return their jobs;
        reconcile the table with what runs here."""
        sent_at = asyncio.get_running_loop().time()
        if not await store.heartbeat():
            await self._lease_lost(store)
        self.clock_offset = store.clock_offset
        self._post(LeaseRenewed(sent_at))
        # Judge others dead only after a whole lease in touch: when the database itself was
        # out of reach (or frozen) past the lease, every supervisor's heartbeat is old, and
        # the first back must give the others the time to come back and write what their
        # jobs did before taking those jobs for dead.
        suspects = self._watch_peers(await store.peers(), now)
        if now - self._in_touch_since >= self.settings.lease:  # (and orphaned jobs)
            rescued = await store.rescue_expired(suspects)
            if rescued:
                log.warning(_rescued_line(rescued))
                self.fetch_wanted = True
        await self._reconcile()
        self._next_heartbeat = now + self.settings.heartbeat_interval

    async def _reconcile(self) -> None:
        """Give back rows the table says this supervisor runs but it does not: a claim that
        committed after its connection was given up, so its answer never came. And pass on
        the cancels the table holds for the jobs it does run: their notification may have
        been lost with a connection.

        Runs on the claim lane between claims, so no claim of the live connection is in
        flight; jobs whose outcome waits in the outbox are still 'running' in the table and
        are kept. A row that finishes between the read and the release fails the release's
        fence and is left alone.
        """
        held = await self.store.held()
        if not held:
            return
        for job_id, _, cancel in held:
            if cancel:
                self._post(CancelRequested(job_id))
        known = {job_id for job_id, _ in self._running_queued()}
        known.update(self.claims.job_ids)
        known.update(self.outbox.job_ids())
        ghosts = [(job_id, claim) for job_id, claim, _ in held if job_id not in known]
        if ghosts:
            ended = await self.store.release(ghosts)
            returned = sorted(i for i, status in ended.items() if status == "pending")
            cancelled = sorted(i for i, status in ended.items() if status == "cancelled")
            if returned:
                log.warning("returned %s to the queue whose claim went through after its "
                            "connection was given up: %s", plural(len(returned), "job"),
                            some_ids(returned))
                self.fetch_wanted = True
            if cancelled:
                log.info("%s whose claim went through after its connection was given up "
                         "ended cancelled, as asked: %s", plural(len(cancelled), "job"),
                         some_ids(cancelled))

    def _watch_peers(self, peers, now: float) -> list[tuple[int, float]]:
        """The other supervisors whose heartbeat has stood still for their whole lease, by
        this process's monotonic clock: (id, heartbeat_at) for rescue_expired. The table's
        timestamps alone would take everyone for dead when the server's clock jumps ahead."""
        seen, suspects = {}, []
        for peer_id, beat, lease in peers:
            last = self._peer_beats.get(peer_id)
            seen[peer_id] = last if last is not None and last[0] == beat else (beat, now)
            # -inf: it left with jobs still running (AsyncStore.close): no need to wait.
            if now - seen[peer_id][1] >= lease or beat == -math.inf:
                suspects.append((peer_id, beat))
        self._peer_beats = seen
        return suspects

    async def _lease_lost(self, store: AsyncStore) -> None:
        """This supervisor's row was found gone (and made again): stop the jobs it lost.

        A rescuer deletes the row and hands back its jobs in one transaction, so the jobs the
        table still says run under this supervisor's claims were not taken over: the row was
        deleted some other way (by hand, say). Those run on; their outcomes still pass the
        fence."""
        running = self._running_queued()
        try:
            mine = {(job_id, claim) for job_id, claim, _ in await store.held()}
        except BaseException:  # the next connection finds the row made again: fence now
            self._lease_expired()
            raise
        lost = frozenset(job_id for job_id, claim in running if (job_id, claim) not in mine)
        if not running:
            # (said with the jobs that ran while it ran out; a claim under way may have won
            # rows: fenced too)
            self._post(LeaseExpired(lost, idle=True))
            return
        if not lost:
            log.warning("this supervisor's row in fairsched_supervisors was gone, but none of "
                        "its running jobs had been taken over: registered again, they run on")
            return
        self._lease_expired(lost)

    def _lease_expired(self, lost: frozenset[int] | None = None) -> None:
        log.error("this supervisor's lease had expired and its running jobs were given "
                  "back to the queue; their results here will not be recorded")
        self._post(LeaseExpired(lost))


def _rescued_line(rescued: dict[str, int]) -> str:
    """What a rescue did: 'returned 2 running jobs of dead supervisors to the queue', or
    how many of them ended cancelled (as asked meanwhile) or failed (no attempts left)."""
    total = sum(rescued.values())
    jobs = f"{total} running job{'' if total == 1 else 's'} of dead supervisors"
    if set(rescued) == {"pending"}:
        return f"returned {jobs} to the queue"
    parts = [f"{count} {words}" for status, words in (
        ("pending", "returned to the queue"), ("cancelled", "cancelled, as asked"),
        ("failed", "failed, with no attempts left")) if (count := rescued.get(status))]
    return f"took back {jobs}: {', '.join(parts)}"
