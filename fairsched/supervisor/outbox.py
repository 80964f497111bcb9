"""The outbox of job outcomes (succeeded, failed, cancelled, released) that the outcome lane
(queue_link.py) writes to the job table: gathered between round trips, written in batches, and
kept across a lost connection until written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from fairsched.logs import some_ids
from fairsched.store.aqueue import AsyncStore

log = logging.getLogger("fairsched.queue")

# One statement writes at most this many results, or this many bytes of them: a backlog
# gathered while the database was out of reach (results of up to a frame, 1 MiB, each) goes
# out in statements that each finish well within queue_link.ANSWER_WITHIN, and stay far below the 256 MB
# a jsonb value can hold.
CHUNK_ROWS = 1000
CHUNK_BYTES = 4 << 20


def completion_chunk(completions: list) -> list:
    """The first (id, claim, JSON text) completions that fit in one statement (at least one)."""
    size = 0
    for n, (_, _, text) in enumerate(completions[:CHUNK_ROWS]):
        size += len(text) if text else 4
        if size > CHUNK_BYTES and n:
            return completions[:n]
    return completions[:CHUNK_ROWS]


@dataclass
class Failure:
    job_id: int
    claim: int  # the claim the failed attempt ran under (QueuedJob.claim)
    error: str
    permanent: bool
    retry_delay: float


@dataclass
class Outbox:
    completions: list[tuple[int, int, str | None]] = field(default_factory=list)  # JSON text
    failures: list[Failure] = field(default_factory=list)
    cancels: list[tuple[int, int]] = field(default_factory=list)
    releases: list[tuple[int, int]] = field(default_factory=list)
    # How the supervisor counted each completion and failure waiting here, (type, outcome):
    # one the table refuses is told to `on_unrecorded`, as counted twice across supervisors.
    counted: dict[int, tuple[str, str]] = field(default_factory=dict)
    on_unrecorded: Callable[[str, str], None] | None = None
    # What to say once a release is written, given the status the job took ('pending', or
    # 'cancelled' when its cancel reached the table first): whether it went back to the queue
    # is known only then (with this supervisor's lease in doubt, it may not have).
    release_lines: dict[int, Callable[[str], None]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.completions or self.failures or self.cancels or self.releases)

    def note(self, job_id: int, counted: tuple[str, str] | None) -> None:
        if counted is not None:
            self.counted[job_id] = counted

    def job_ids(self) -> list[int]:
        """The jobs whose outcome waits here: still 'running' in the table until it is written."""
        return ([c[0] for c in self.completions] + [f.job_id for f in self.failures]
                + [c[0] for c in self.cancels] + [r[0] for r in self.releases])

    async def write(self, store: AsyncStore) -> None:
        """Write the outcomes waiting here (the completions one statement's worth at a time),
        removing each once written: a lost connection leaves the rest for the next try, and
        fencing makes a repeated write harmless."""
        refused = []
        if self.completions:
            batch = completion_chunk(self.completions)
            changed = set(await store.complete(batch))
            unchanged = [(job_id, claim) for job_id, claim, _ in batch if job_id not in changed]
            if unchanged:  # written already, by a try whose answer was lost, or not ours now
                done = await store.completed_already(unchanged)
                refused += [job_id for job_id, _ in unchanged if job_id not in done]
            del self.completions[:len(batch)]
            self._written([job_id for job_id, _, _ in batch], refused)
        while self.failures:
            f = self.failures[0]
            status = await store.fail(f.job_id, f.claim, f.error, permanent=f.permanent,
                                      retry_delay=f.retry_delay)
            if status is None:  # written already, by a try whose answer was lost, or not ours
                status = await store.failed_already(f.job_id, f.claim, f.error)
            self.failures.pop(0)
            if status is None:
                refused.append(f.job_id)
            elif status == "cancelled":  # the cancel and the failure crossed
                log.info("job %s ended cancelled, as asked: its cancel reached the job table "
                         "before its failed attempt was recorded", f.job_id)
            self._written([f.job_id], refused)
        if refused:
            # The row moved on without us: handed back to the queue after this supervisor's
            # lease expired, and perhaps run again elsewhere. The log said "succeeded" or
            # "failed" for what the worker reported; the table keeps what happened since.
            # Or it is gone: deleted from the table while the job ran.
            gone = await store.missing(refused)
            for ids, why in (([i for i in refused if i not in gone],
                              "no longer this supervisor's (its lease expired while it ran)"),
                             ([i for i in refused if i in gone],
                              "its row was deleted from fairsched_jobs while it ran")):
                if ids:
                    log.warning("the outcome of %d job%s was not recorded: %s: %s", len(ids),
                                "" if len(ids) == 1 else "s", why, some_ids(ids))
        while self.cancels:
            job_id, claim = self.cancels[0]
            await store.cancel_finish(job_id, claim)
            self.cancels.pop(0)
        if self.releases:
            batch = self.releases[:]
            ended = await store.release(batch)
            unchanged = [(job_id, claim) for job_id, claim in batch if job_id not in ended]
            refused = []
            if unchanged:  # written already, by a try whose answer was lost, or not ours now
                ended |= await store.released_already(unchanged)
                refused = [job_id for job_id, _ in unchanged if job_id not in ended]
            gone = await store.missing(refused) if refused else set()
            del self.releases[:len(batch)]
            for job_id, _ in batch:
                self._released(job_id, ended.get(job_id), refused, gone)

    def _released(self, job_id: int, status: str | None, refused: list[int],
                  gone: set[int]) -> None:
        said = self.release_lines.pop(job_id, None)
        if job_id in gone:
            log.warning("job %s was not returned to the queue: its row was deleted from "
                        "fairsched_jobs while it ran", job_id)
        elif job_id in refused:
            log.warning("job %s was already taken over by another supervisor (this "
                        "supervisor's lease had expired): not returned to the queue", job_id)
        elif said is not None:
            said(status)
        elif status == "cancelled":
            log.info("job %s ended cancelled, as asked: its cancel reached the job table as it "
                     "was handed back", job_id)

    def _written(self, job_ids: list[int], refused: list[int]) -> None:
        for job_id in job_ids:
            counted = self.counted.pop(job_id, None)
            if counted is not None and job_id in refused and self.on_unrecorded is not None:
                self.on_unrecorded(*counted)
