"""The supervisor's lanes to PostgreSQL: fetch, claim, complete, heartbeat, rescue, reconnect.

The actor never awaits the database inside a scheduling decision: it hands work to two
coroutines, each on its own connection. The claim lane heartbeats, rescues, claims and fetches;
the outcome lane writes job outcomes (succeeded, failed, cancelled, released) from an outbox
(outbox.py), in one batch per round trip, so completions and claims overlap. The outbox
survives a lost connection (fencing makes a repeated write harmless), so nothing is lost when
PostgreSQL restarts. Both connections act as the same supervisor id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time

import psycopg

from fairsched.backoff import backoff
from fairsched.config import age_text
from fairsched.logs import first_line, some_ids
from fairsched.store.aqueue import AsyncStore
from fairsched.store.connections import ANSWER_WITHIN
from fairsched.store.database import open_database
from fairsched.store.errors import DatabaseUnavailable
from fairsched.store.queue import Queue
from fairsched.store.schedules import enqueue_due, next_due
from fairsched.store.schedules import now as database_now
from fairsched.supervisor.in_flight import Claims
from fairsched.supervisor.locked_rows import LockedRows
from fairsched.supervisor.messages import (
    Backlog,
    CancelRequested,
    Claimed,
    Connected,
    Disconnected,
    FetchBegan,
    Fetched,
    Held,
    JobsNotified,
    LeaseRenewed,
    NextDue,
    OutcomeUnrecorded,
    Stale,
)
from fairsched.supervisor.outbox import Failure, Outbox
from fairsched.supervisor.peers import Heartbeats

log = logging.getLogger("fairsched.queue")

RECONNECT_FIRST = 0.1
RECONNECT_MAX = 5.0
# After writing outcomes, let the next ones gather this long: a slot is free again the moment
# its worker answers, so this delays only the row's update, and folds many commits into one.
OUTCOME_LINGER = 0.005
# With prune_after set, finished jobs are deleted this often (a quarter of prune_after when that
# is shorter), a batch of rows at a time, so the table holds about prune_after's worth of them.
PRUNE_EVERY = 3600.0
# Seconds at most between two checks of the schedules: the lane wakes at the next due time,
# and at least this often, so a schedule a reload adds or changes is seen within it.
SCHEDULE_CHECK = 1.0
# A database that takes no writes (a standby, as a failover can leave one) is as good as lost:
# reconnecting is how the supervisor finds the primary again, wherever the URL now leads.
READ_ONLY = psycopg.errors.ReadOnlySqlTransaction
# DatabaseUnavailable: an embedded server that cannot be started again.
DB_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, READ_ONLY, DatabaseUnavailable)
# A lane's round trips (a few statements) that take longer than ANSWER_WITHIN of the lease are
# taken for a lost connection, whatever the transport (over a Unix socket nothing else would
# notice). A slow round delays the next heartbeat, due at most `lease / 3` after the last one:
# the two together stay short of lease.CANCEL_AT, so a database that is slow but answers never
# makes this supervisor give its jobs back. The server ends such a statement too (connections.py).


class QueueLink(Heartbeats):
    """Takes requests from the actor (fetch, claim, outcomes) and posts what came of them, and
    what the database said unasked, as messages (messages.py) to `post`. It asks the actor two
    things, through the callables it was given: the free slots by type a fetch is for
    (`wanted`), and the queued jobs running here, (job id, claim) (`running_queued`)."""

    def __init__(self, config, post, observer, wanted, running_queued):
        self._post = post
        self.observer = observer
        self._wanted = wanted
        self._running_queued = running_queued
        self.config = config
        self.priority_per_second = config.scoring.priority / config.scoring.age
        self.settings = config.supervisor
        self.default_max_attempts = config.max_attempts_by_type()
        self.database = None
        self.store: AsyncStore | None = None
        self.writer: AsyncStore | None = None  # the outcome lane's connection
        self.supervisor_id: str | None = None
        self.outbox = Outbox(on_unrecorded=lambda job_type, outcome: post(
            OutcomeUnrecorded(job_type, outcome)))
        self.claims = Claims()  # jobs reserved by the actor on their slots, not yet claimed
        self.holds: list = []  # [limits]: (on-demand request, slot id) waiting for a place
        self.hold_releases: list[int] = []  # [limits]: places to give back
        self.limit_running: dict[str, int] = {}  # [limits]: as of the last heartbeat
        self.claiming: AsyncStore | None = None  # the connection a claim is on its way over
        self.fetch_wanted = False
        self.backlog_wanted: dict[str, int] = {}  # types to count waiting jobs of, with caps
        self.backlog_wait = 0.0  # seconds a job must have waited to count
        self.connected = False
        self._refused_writes = False  # said that the database takes no writes
        self._unavailable: str | None = None  # the last DatabaseUnavailable said, said once
        self.closing = False
        self._winding_down = False  # the supervisor is shutting down
        self._wake = asyncio.Event()
        self._outbox_wake = asyncio.Event()
        self._give_up = asyncio.Event()  # close(): stop waiting for the database (stop_waiting)
        self.unrecorded = 0  # job outcomes close() could not write
        self.due_unknown = True  # when the next delayed job comes due is to be asked again
        self._task: asyncio.Task | None = None
        self._writer_task: asyncio.Task | None = None
        self._listen_task: asyncio.Task | None = None
        self._prune_task: asyncio.Task | None = None
        self._prune_stop = threading.Event()  # a prune in its thread stops after its batch
        self._schedule_task: asyncio.Task | None = None
        self._schedule_conn = None  # the schedule lane's connection, used in its thread
        self._schedules_seen: dict = {}  # name: (its ScheduleSpec, latest due time at a check)
        self._schedule_lock = threading.Lock()  # held by a check in its thread
        self._next_heartbeat = 0.0
        self._in_touch_since = 0.0  # monotonic time of the claim lane's last (re)connection
        self._peer_beats: dict[int, tuple[float, float]] = {}  # id: (heartbeat_at, seen since)
        self._next_poll = 0.0
        self._locked = LockedRows()  # rows a claim lost to someone else's lock
        self.claim_losses = 0
        self.clock_offset = 0.0  # the server's clock minus this host's (AsyncStore.clock_offset)
        self.answer_within = self.settings.lease * ANSWER_WITHIN
        self._abandoned: set[asyncio.Task] = set()
        # Reconnect at least every quarter lease once the database is back, so a supervisor
        # that judges others after a lease in touch finds this one back in time.
        self.reconnect_max = min(RECONNECT_MAX, self.settings.lease / 4)

    def reconfigure(self, config) -> None:
        """A reload: the fetch's order (by score: the [scoring] weights), the max_attempts a
        job claimed without its own gets, and the poll interval, from the next use of each.
        The settings that take a restart are the same (reload.RESTART_KEYS)."""
        self.config = config
        self.priority_per_second = config.scoring.priority / config.scoring.age
        self.settings = config.supervisor
        self.default_max_attempts = config.max_attempts_by_type()
        for store in (self.store, self.writer):
            if store is not None:
                store.usage_half_life = config.usage_half_life
                store.limited_types = sorted(config.limits)

    @property
    def kind(self) -> str:
        return self.database.kind if self.database is not None else "unknown"

    def database_url(self) -> str | None:
        """The URL the queue's database is reached at now (a worker's job.transaction() opens
        its own connection with it); None before it is opened."""
        return self.database.url if self.database is not None else None

    # -- called by the actor (synchronous, never blocks) -------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def request_fetch(self, *, due_unknown: bool = False) -> None:
        """Fetch the best candidates for the free slots; `due_unknown`: and learn again when
        the next delayed job comes due."""
        if due_unknown:
            self.due_unknown = True
        if not self.fetch_wanted:
            self.fetch_wanted = True
            self.wake()

    def request_backlog(self, caps: dict[str, int], wait: float) -> None:
        """Count the jobs of these types that have waited `wait` seconds or more, up to each
        one's cap (the autoscaler's question, answered by a Backlog message)."""
        if caps:
            self.backlog_wanted, self.backlog_wait = dict(caps), wait
            self.wake()

    def claim(self, job_ids, slot_ids) -> None:
        """Claim these jobs, reserved on these slots (arrays, or sequences of ints)."""
        self.claims.extend(job_ids, slot_ids)
        self.wake()

    def hold(self, req, slot_id: int) -> None:
        """[limits]: take a place for an on-demand request of a limited type, placed on this
        slot; the answer comes as Held."""
        self.holds.append((req, slot_id))
        self.wake()

    def release_hold(self, hold: int) -> None:
        """[limits]: an on-demand job's place is free again."""
        self.hold_releases.append(hold)
        self.wake()

    def complete(self, job_id: int, claim: int, text: str | None, counted=None) -> None:
        """Record a success; `text` is its result as JSON text (rows.encode_result); `counted`:
        (type, outcome) as the metrics counted it."""
        self.outbox.completions.append((job_id, claim, text))
        self.outbox.note(job_id, counted)
        self._outbox_wake.set()

    def fail(self, failure: Failure, counted=None) -> None:
        self.outbox.failures.append(failure)
        self.outbox.note(failure.job_id, counted)
        self._outbox_wake.set()

    def cancel_finish(self, job_id: int, claim: int) -> None:
        self.outbox.cancels.append((job_id, claim))
        self._outbox_wake.set()

    def release(self, job_id: int, claim: int, said=None) -> None:
        """Hand a job back to the queue; `said`, if given, logs that it went back once the
        table has taken the release (with the lease in doubt it may refuse it)."""
        self.outbox.releases.append((job_id, claim))
        if said is not None:
            self.outbox.release_lines[job_id] = said
        self._outbox_wake.set()

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.database = await loop.run_in_executor(
            None, open_database, self.settings.state_dir, self.settings.database,
            self.config.path)
        await self._connect()
        self._task = asyncio.create_task(self._run(), name="fairsched-queue")
        self._writer_task = asyncio.create_task(self._run_outcomes(), name="fairsched-outcomes")
        if self.settings.prune_after is not None:
            self._prune_task = asyncio.create_task(self._run_prune(), name="fairsched-prune")
        self._schedule_task = asyncio.create_task(self._run_schedules(),
                                                  name="fairsched-schedules")

    async def _connect(self) -> None:
        if self.database.kind == "embedded":
            await asyncio.get_running_loop().run_in_executor(None, self.database.ensure_running)
        # After a lost connection carry on as the same supervisor, so our claims stay ours.
        sent_at = asyncio.get_running_loop().time()
        store = await AsyncStore.connect(self.database.url, lease=self.settings.lease,
                                         supervisor_id=self.supervisor_id)
        store.usage_half_life = self.config.usage_half_life
        store.limited_types = sorted(self.config.limits)
        self.store = store
        self.supervisor_id = store.supervisor_id
        self.connected = True
        self._refused_writes = False
        self._in_touch_since = time.monotonic()
        if store.lease_lost:
            await self._lease_lost(store)
        self._post(LeaseRenewed(sent_at))
        self._stale()  # what was notified while the connection was down never reached us
        await self._reconcile()
        if self._listen_task is None or self._listen_task.done():
            self._listen_task = asyncio.create_task(self._listen(), name="fairsched-listen")
        self.fetch_wanted = True

    async def close(self, timeout: float | None = None) -> None:
        """Flush the outbox, deregister and stop an embedded server this process started.

        With the database out of reach the outbox waits for it up to `timeout` (default: the
        lease, while the rows are still this supervisor's), or until `stop_waiting`."""
        self.claims = Claims()
        self.fetch_wanted = False
        timeout = self.settings.lease if timeout is None else timeout
        deadline = time.monotonic() + timeout
        # A claim already on its way may win rows: wait for its answer (as long as a round
        # trip may take), so the actor hands them back unspent instead of leaving them running
        # under this supervisor until a rescue counts an attempt that never ran.
        claim_deadline = min(deadline, time.monotonic() + self.answer_within)
        while (self.claiming is not None and time.monotonic() < claim_deadline
               and not self._give_up.is_set()):
            await asyncio.sleep(0.005)
        said = hurried = False
        while (self.outbox and time.monotonic() < deadline
               and self._writer_task and not self._writer_task.done()):
            if self._give_up.is_set() and not hurried:  # a database in reach gets a second
                deadline, hurried = min(deadline, time.monotonic() + 1.0), True
                continue
            if not said and not self.connected:
                waiting = len(self.outbox.job_ids())
                log.warning("waiting up to %g s for the database to record the outcome of %d "
                            "job%s (a second SIGTERM or `fairsched stop` stops waiting)",
                            round(deadline - time.monotonic(), 1), waiting,
                            "" if waiting == 1 else "s")
                said = True
            self._outbox_wake.set()
            await asyncio.sleep(0.01)
        if self.outbox:
            ids = self.outbox.job_ids()
            self.unrecorded = len(ids)
            log.error("could not record the outcome of %d job%s before exiting (%s): once the "
                      "database is back and this supervisor's lease has run out, another "
                      "supervisor returns them to the queue as failed attempts (finished ones "
                      "run again)", len(ids), "" if len(ids) == 1 else "s", some_ids(ids))
        self.closing = True
        self._prune_stop.set()
        self._wake.set()  # lanes that wait see `closing`, even if a cancel should get lost
        self._outbox_wake.set()
        tasks = [t for t in (self._task, self._writer_task, self._listen_task, self._prune_task,
                             self._schedule_task)
                 if t is not None]
        for _ in range(3):
            if not tasks:
                break
            # Python 3.11's wait_for can swallow a cancel that lands as its work completes:
            # cancel again rather than wait for ever on a lane that missed it.
            for task in tasks:
                task.cancel()
            _, pending = await asyncio.wait(tasks, timeout=1.0)
            tasks = list(pending)
        if tasks:
            log.debug("database lanes still running at exit: %s", tasks)
        # A check still under way in its thread closes the connection itself, seeing `closing`:
        # closing it from here while that thread uses it would pull it from under libpq.
        if self._schedule_lock.acquire(blocking=False):
            try:
                self._drop_schedule_conn()
            finally:
                self._schedule_lock.release()
        if self.writer is not None:
            try:
                await self.writer.close(deregister=False)
            except Exception:
                pass
        if self.store is not None:
            try:  # a silent server would hold the exit for ever: as long as a round trip only
                await self._answer(self.store.close(deregister=True))
            except Exception as exc:  # the database may be gone; the lease covers it
                log.warning("could not deregister from the database: %s", first_line(exc))
        if self.database is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.database.close)
            except Exception as exc:  # the embedded server would not stop: say so, exit anyway
                log.error("%s", exc)

    def wind_down(self) -> None:
        """The supervisor is shutting down (the lanes say so in what they log)."""
        self._winding_down = True

    def _stale(self) -> None:
        self.due_unknown = True  # a delayed job may have come due, or a retry
        self._post(Stale())

    def stop_waiting(self) -> None:
        """Exit without waiting any longer for the database (a second stop signal)."""
        self._give_up.set()

    # -- the lane -------------------------------------------------------------------------------

    def _reconnect_delay(self, failures: int) -> float:
        """How long a lane waits before it tries again after `failures` failures in a row."""
        return backoff(failures, RECONNECT_FIRST, self.reconnect_max)

    async def _run(self) -> None:
        failures = 0  # in a row
        lost = False  # the database went out of reach (not a lane that failed and started over)
        while not self.closing:
            try:
                if self.store is None:
                    await self._answer(self._connect())
                    if lost:
                        log.info("database connection restored")
                    lost = False
                    self._post(Connected())
                await self._answer(self._drain())
                failures = 0
                if not self._pending():
                    timeout = max(0.0, self._next_timer() - time.monotonic())
                    try:
                        await asyncio.wait_for(self._wake.wait(), timeout)
                    except TimeoutError:
                        pass
                self._wake.clear()
            except Exception as exc:
                delay = self._reconnect_delay(failures)
                if not isinstance(exc, DB_ERRORS):  # never expected: say so, loudly
                    log.exception("the claim lane failed; starting over in %g s", delay)
                elif isinstance(exc, READ_ONLY):
                    if not self._refused_writes:  # once, until it takes them again
                        log.error("the database refuses writes: %s (a standby?); reconnecting "
                                  "until it takes them%s", first_line(exc),
                                  "" if self._winding_down else " (workers keep running)")
                    self._refused_writes = lost = True
                elif self.connected:
                    log.error("lost the database: %s; reconnecting%s", first_line(exc),
                              "" if self._winding_down else " (workers keep running)")
                    lost = True
                elif isinstance(exc, DatabaseUnavailable) and str(exc) != self._unavailable:
                    log.error("%s; trying again", exc)  # once, not at every attempt
                self._unavailable = str(exc) if isinstance(exc, DatabaseUnavailable) else None
                self.connected = False
                # A cycle may have waited for a fetch that will not come: it plans now with
                # what is known, and waiting on-demand requests run without the database.
                self._post(Disconnected())
                await self._drop_store()
                self._requeue_claims()
                await asyncio.sleep(delay)
                failures += 1

    async def _answer(self, work):
        """Await a lane's round trips; one that hangs counts as a lost connection.

        The hung work is cancelled but not waited for: psycopg first asks the server to
        cancel the statement and waits for that too, which a silent server never answers.
        The caller drops the connection; a claim that still commits is reconciled later.
        """
        task = asyncio.ensure_future(work)
        try:
            return await asyncio.wait_for(asyncio.shield(task), self.answer_within)
        except TimeoutError:
            self._abandon(task)
            raise psycopg.OperationalError(
                f"no answer from PostgreSQL within {self.answer_within:.3g} s") from None
        except asyncio.CancelledError:  # closing: the connection goes, the work ends with it
            self._abandon(task)
            raise

    def _abandon(self, task: asyncio.Task) -> None:
        task.cancel()
        self._abandoned.add(task)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task) -> None:
        self._abandoned.discard(task)
        if task.cancelled() or task.exception() is not None:
            return  # it ended with the connection given up
        late = task.result()
        if isinstance(late, AsyncStore):  # a connection that came just too late: not wanted
            closing = asyncio.ensure_future(late.close(deregister=False))
            self._abandoned.add(closing)
            closing.add_done_callback(self._forget)

    def _pending(self) -> bool:
        return bool(self.claims or self.fetch_wanted or self.backlog_wanted or self.holds
                    or self.hold_releases or time.monotonic() >= self._next_timer())

    def _next_timer(self) -> float:
        return min(self._next_heartbeat, self._next_poll, self._locked.next_retry())

    async def _drop_store(self) -> None:
        store, self.store = self.store, None
        if store is not None:
            try:
                await store.close(deregister=False)
            except Exception:
                pass

    def _requeue_claims(self) -> None:
        # Claims whose statement never ran (or whose outcome is unknown): the actor frees the
        # slots; _reconcile returns any row that did get claimed.
        claims, self.claims = self.claims, Claims()
        if claims:
            self._post(Claimed(claims, {}, contested=False))

    async def _run_outcomes(self) -> None:
        failures = 0  # in a row
        writer_since = 0.0  # monotonic time the outcome lane's connection was made
        while not self.closing:
            try:
                if self.writer is None:
                    if self.supervisor_id is None or not self.connected:
                        # The claim lane registers and reconnects first.
                        await asyncio.sleep(self._reconnect_delay(failures))
                        continue
                    self.writer = await self._answer(AsyncStore.connect(
                        self.database.url, lease=self.settings.lease,
                        supervisor_id=self.supervisor_id, lane="outcomes"))
                    self.writer.usage_half_life = self.config.usage_half_life
                    self.writer.limited_types = sorted(self.config.limits)
                    writer_since = time.monotonic()
                    if self.writer.lease_lost:  # found first here that our row was rescued
                        await self._answer(self._lease_lost(self.writer))
                self._outbox_wake.clear()
                if self.outbox:
                    await self._answer(self.outbox.write(self.writer))
                    failures = 0
                    await asyncio.sleep(OUTCOME_LINGER)
                else:
                    await self._outbox_wake.wait()
            except DB_ERRORS as exc:
                delay = self._reconnect_delay(failures)
                # A connection older than the claim lane's last reconnection was lost in the
                # outage the claim lane has reported and recovered from: replace it at once.
                stale = self.writer is not None and writer_since < self._in_touch_since
                if self.connected and not stale:  # the claim lane gets answers: trouble is here
                    waiting = len(self.outbox.job_ids())
                    log.warning("could not write %d job outcome%s: %s; trying again in %g s",
                                waiting, "" if waiting == 1 else "s", first_line(exc), delay)
                else:  # the claim lane says (or said) the database was lost, once
                    log.debug("outcome lane lost the database: %s", exc)
                writer, self.writer = self.writer, None
                if writer is not None:
                    try:
                        await writer.close(deregister=False)
                    except Exception:
                        pass
                if not (stale and self.connected):
                    await asyncio.sleep(delay)
                    failures += 1
            except Exception:  # never expected: say so, loudly, and keep the lane alive
                delay = self._reconnect_delay(failures)
                waiting = len(self.outbox.job_ids())
                log.exception("could not write %d job outcome%s; trying again in %g s",
                              waiting, "" if waiting == 1 else "s", delay)
                await asyncio.sleep(delay)
                failures += 1

    async def _run_prune(self) -> None:
        """Delete the succeeded and cancelled jobs that finished more than prune_after ago, at
        start and then every PRUNE_EVERY, on a connection of its own in a thread: its batches
        never hold up a claim, an outcome or a heartbeat. Failed jobs (the dead-letter list)
        stay. Supervisors sharing a database may all prune: a row goes once."""
        age = self.settings.prune_after
        every = min(PRUNE_EVERY, max(1.0, age / 4))
        loop = asyncio.get_running_loop()
        while not self.closing:
            if not self.connected:  # the claim lane says so, and reconnects
                await asyncio.sleep(min(every, 1.0))
                continue
            try:
                count = await loop.run_in_executor(None, self._prune, age)
            except (psycopg.Error, DatabaseUnavailable) as exc:
                if self.connected:
                    log.warning("could not prune finished jobs: %s; trying again in %s",
                                first_line(exc), age_text(every))
            except Exception:  # never expected: say so, loudly, and keep the lane alive
                log.exception("could not prune finished jobs; trying again in %s",
                              age_text(every))
            else:
                if count:
                    self.observer.jobs_pruned(count)
                    log.info("pruned %d succeeded or cancelled job%s that finished more than %s "
                             "ago (prune_after)", count, "" if count == 1 else "s", age_text(age))
            await asyncio.sleep(every)

    async def _run_schedules(self) -> None:
        """Enqueue each [[schedule]]'s due times, at each next due time (and at least every
        SCHEDULE_CHECK), on a connection of its own in a thread. Every supervisor sharing the
        database checks; the table lets one job through per due time (store/schedules.py)."""
        loop = asyncio.get_running_loop()
        while not self.closing:
            schedules = self.config.schedules
            if not schedules or not self.connected:  # the claim lane reconnects
                await asyncio.sleep(SCHEDULE_CHECK)
                continue
            wait = SCHEDULE_CHECK
            try:
                enqueued, wait = await loop.run_in_executor(None, self._check_schedules,
                                                            schedules)
            except (psycopg.Error, DatabaseUnavailable) as exc:
                self._drop_schedule_conn()  # its thread is done: the answer came
                if self.connected and not self.closing:
                    log.warning("could not enqueue scheduled jobs: %s; trying again in %g s",
                                first_line(exc), wait)
            except Exception:  # never expected: say so, loudly, and keep the lane alive
                self._drop_schedule_conn()
                log.exception("could not enqueue scheduled jobs; trying again in %g s", wait)
            else:
                for done in enqueued:
                    if done.folded > 1:
                        log.info("schedule %s: enqueued job %d for %s, once for %d due times "
                                 "missed while no supervisor ran", done.name, done.job_id,
                                 done.due.isoformat(), done.folded)
                    else:
                        log.info("schedule %s: enqueued job %d for %s", done.name, done.job_id,
                                 done.due.isoformat())
            await asyncio.sleep(wait)

    def _check_schedules(self, schedules) -> tuple[list, float]:
        # In an executor thread: what was enqueued, and the seconds until the next due time.
        with self._schedule_lock:
            try:
                return self._enqueue_due(schedules)
            finally:
                if self.closing:
                    self._drop_schedule_conn()

    def _enqueue_due(self, schedules) -> tuple[list, float]:
        if self._schedule_conn is None:
            self._schedule_conn = self.database.connect(autocommit=True)
        conn = self._schedule_conn
        enqueued = []
        for spec in schedules:
            seen = self._schedules_seen.get(spec.name)
            # The due time found at this lane's last check of this very schedule: the times
            # after it each get a job (this supervisor was running then, if late).
            since = seen[1] if seen is not None and seen[0] == spec else None
            latest, done = enqueue_due(conn, spec, since)
            self._schedules_seen[spec.name] = (spec, latest)
            enqueued += done
        clock = database_now(conn)
        soonest = min((next_due(spec, clock) - clock).total_seconds() for spec in schedules)
        # A little past the due time: the check reads the clock again, and must find it due.
        return enqueued, min(SCHEDULE_CHECK, max(0.0, soonest) + 0.005)

    def _drop_schedule_conn(self) -> None:
        conn, self._schedule_conn = self._schedule_conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _prune(self, age: float) -> int:
        # In an executor thread: psycopg's synchronous connection, closed before returning.
        with self.database.connect() as conn:
            return Queue(conn).prune_jobs(age, stop=self._prune_stop.is_set)

    async def _drain(self) -> None:
        store = self.store
        now = time.monotonic()
        if now >= self._next_heartbeat:
            await self._heartbeat(store, now)
            if self.config.limits:  # for ps: how full each limited type is, fleet-wide
                self.limit_running = await store.limit_running(sorted(self.config.limits))
        if now >= self._next_poll:
            # The safety net behind LISTEN/NOTIFY, and the clock for delayed jobs.
            self._stale()
            self.fetch_wanted = True
            self._next_poll = now + self.settings.poll_interval
        if self.hold_releases:
            # Taken off only once written: a lost connection leaves them for the next one.
            await store.release_holds(self.hold_releases)
            self.hold_releases = []
        while self.holds:
            req, slot_id = self.holds[0]
            hold = await store.hold(req.type, self.config.limits.get(req.type, 0))
            self.holds.pop(0)
            self._post(Held(req, slot_id, hold))
        if self.claims:
            claims, self.claims = self.claims, Claims()
            self.claiming = store  # until the actor has the answer (close() waits for it)
            try:
                won, refused = await store.claim_within(claims.ids(), self.default_max_attempts,
                                                        self.config.limits)
            except BaseException:
                if self.claiming is store:  # not a claim sent since over a new connection
                    self.claiming = None
                if self.store is store:  # the lane goes on with this connection: sent again
                    claims.extend(self.claims.job_ids, self.claims.slot_ids)
                    self.claims = claims
                else:
                    # Given up for want of an answer (_answer), and perhaps connected again
                    # since: its _requeue_claims has run. The slots are free at once, and the
                    # next connection's reconcile returns any row the claim did win, which
                    # these claims, put back, would have hidden from it.
                    self._post(Claimed(claims, {}, contested=False))
                raise
            if log.isEnabledFor(logging.DEBUG):
                log.debug("claimed %d of %d job%s", len(won), len(claims),
                          "" if len(claims) == 1 else "s")
            # A fetch wanted goes out before the jobs won are handed to their workers, and is
            # answered meanwhile: the rows just claimed are no longer pending, so it cannot
            # find them, and the lane does not wait for the dispatch of a large claim.
            fetching = None
            try:
                if self.fetch_wanted and not self.claims and len(won) == len(claims):
                    fetching = asyncio.ensure_future(self._fetch(store))
                    await asyncio.sleep(0)  # its first step sends the statement
            except BaseException:  # closing: the actor hands the jobs won back, unspent
                if fetching is not None:
                    fetching.cancel()
                raise
            finally:
                if self.claiming is store:
                    self.claiming = None
                self._post(Claimed(claims, {qj.id: qj for qj in won}, refused=refused))
            if fetching is not None:
                try:
                    await fetching
                finally:
                    if not fetching.done():
                        fetching.cancel()
                return  # what it found is planned before anything else is asked
            if len(won) < len(claims):
                await self._note_locked(claims, won)
        if self._locked.expire(now):
            self._stale()  # the rows left out may be free now: look afresh
            self.fetch_wanted = True
        if self.fetch_wanted and not self.claims:
            await self._fetch(store)
        if self.backlog_wanted and not self.claims:
            caps, self.backlog_wanted = self.backlog_wanted, {}
            self._post(Backlog(await store.backlog(caps, self.backlog_wait)))

    async def _fetch(self, store: AsyncStore) -> None:
        self.fetch_wanted = False
        wanted = self._wanted()
        if not wanted:
            return
        self._post(FetchBegan())  # rows notified before this fetch are in its answer
        rows = await store.fetch(self._locked.asking(wanted), self.priority_per_second)
        rows = self._locked.kept(rows, wanted)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("fetched %d candidate%s for %s", len(rows), "" if len(rows) == 1 else "s",
                      ", ".join(f"{t} ({n} free)" for t, n in sorted(wanted.items())))
        self._post(Fetched(rows, wanted))
        # When the next delayed job or retry comes due, the jobs fetched may no longer be the
        # best: learn when, if the fetch came back short (what is due is drained) or a job was
        # notified since last asked (a new one may be delayed).
        if self.due_unknown or len(rows) < sum(2 * n for n in wanted.values()):
            self.due_unknown = False
            await self._arm_delayed_wakeup()

    async def _note_locked(self, claims, won) -> None:
        """Leave out of fetches for a while the rows this claim lost that are still pending:
        locked by someone else, as the claim skips locked rows."""
        won_ids = {qj.id for qj in won}
        lost = [job_id for job_id, _ in claims if job_id not in won_ids]
        self._locked.note(await self.store.still_pending(lost), time.monotonic())

    async def _arm_delayed_wakeup(self) -> None:
        delay = await self.store.next_eligible_in()
        if delay is not None:
            self._post(NextDue(delay))

    async def _listen(self) -> None:
        failures = 0  # in a row
        lost = False
        while not self.closing:
            notifications = None
            try:
                notifications = self.store_listen()
                await notifications
                # LISTEN is in effect from here on. A job added before it was (while it was
                # down, or between the first fetch and the first LISTEN) was notified to no
                # one: look afresh, whatever the last fetch found drained.
                self._stale()
                self.request_fetch()
                if lost:
                    lost = False
                    # Cancels too: the heartbeat passes on those the table holds (_reconcile).
                    self._next_heartbeat = 0.0
                    self.wake()
                async for kind, value in notifications:
                    failures = 0
                    if kind == "jobs":
                        self.due_unknown = True  # it may be a delayed job, or a retry
                        self._post(JobsNotified(value))
                    elif kind == "cancel":
                        self._post(CancelRequested(value))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("notification connection lost: %s", exc)
            if notifications is not None:  # its store would hold on to it until it closes
                with contextlib.suppress(Exception):
                    await notifications.aclose()
            lost = True
            await asyncio.sleep(self._reconnect_delay(failures))
            failures += 1

    def store_listen(self):
        store = self.store
        if store is None:
            raise psycopg.OperationalError("not connected")
        return store.listen()
