"""The autoscaler: worker groups whose `processes` is a range ("MIN..MAX") grow while jobs of
their types wait with no compatible slot free, and shrink, one idle process at a time, after
`idle_timeout` seconds without work. Every decision is made here, at each tick; Workers starts
and stops the processes, the queue link counts the queued jobs waiting."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from fairsched.config import WorkerSpec
from fairsched.logs import fields
from fairsched.supervisor.states import ProcessState

log = logging.getLogger("fairsched.supervisor")

TICK = 0.25  # seconds between two looks at the autoscaled groups
# Seconds a group's newest process must have been ready before the group grows again, on a
# backlog counted since: what the group could not run once that process was at work.
GROW_SETTLE = 1.0
# Seconds a job must have been eligible, with no compatible slot free, to call for a process:
# a job that a slot about to free takes at once is no backlog.
GROW_WAIT = 0.5


@dataclass(eq=False)
class GroupScale:
    """One autoscaled group, as the autoscaler sees it."""

    spec: WorkerSpec
    low: int
    high: int
    grown_at: float = -math.inf  # monotonic time of its last growth
    shrunk_at: float = -math.inf  # and of its last shrink
    newest: object | None = None  # the WorkerProcess its last growth started
    settled_at: float | None = None  # when that one was seen ready (or gone)

    @property
    def name(self) -> str:
        return self.spec.name


class Autoscaler:
    """Owns the autoscaled groups' scaling state (`groups`: when each last grew and shrank),
    the last count of queued jobs waiting by type (`backlog`) and its tick timer. Wired by the
    actor to the workers, the planner and the queue link (connect)."""

    def __init__(self, config, loop, run, observer):
        self.config = config
        self.loop = loop
        self.run = run  # RunState: the actor's, read only
        self.observer = observer
        self.groups = {spec.name: GroupScale(spec, *spec.process_range)
                       for spec in config.workers if spec.autoscaled}
        self.backlog: dict[str, int] = {}  # queued jobs waiting GROW_WAIT or more, by type
        self.backlog_asked = -math.inf  # monotonic time the backlog's question was asked
        self._asking = -math.inf  # that of the question on its way
        self._wanting: dict[str, list[str]] = {}  # by group: its types with no slot free
        self._timer = None

    def connect(self, workers, planner, queue) -> None:
        self.workers, self.planner, self.queue = workers, planner, queue

    def reconfigure(self, config) -> None:
        """A reload: the autoscaled groups as the new file has them; what a group that stays
        autoscaled has done (when it last grew and shrank) is kept."""
        self.config = config
        groups = {}
        for spec in config.workers:
            if spec.autoscaled:
                low, high = spec.process_range
                kept = self.groups.get(spec.name)
                if kept is None:
                    groups[spec.name] = GroupScale(spec, low, high)
                else:
                    kept.spec, kept.low, kept.high = spec, low, high
                    groups[spec.name] = kept
        self.groups = groups
        self._wanting = {}  # asked of the groups as they were: the next tick asks again
        self.start()

    def start(self) -> None:
        if any(g.high > g.low for g in self.groups.values()) and self._timer is None:
            self._timer = self.loop.call_later(TICK, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def counted(self, counts: dict[str, int]) -> None:
        """The queue link's answer: queued jobs waiting GROW_WAIT or more, by type."""
        self.backlog = dict(counts)
        self.backlog_asked = self._asking
        if self.run.shutting_down:
            return
        self._grow_wanting(time.monotonic())  # the question's: decided on its answer

    # -- the decisions -------------------------------------------------------------------------

    def _tick(self) -> None:
        self._timer = self.loop.call_later(TICK, self._tick)
        if self.run.shutting_down:
            return
        now = time.monotonic()
        full = self.planner.full_types()
        ask: dict[str, int] = {}
        self._wanting = {}
        for group in self.groups.values():
            if (group.newest is not None and group.settled_at is None
                    and group.newest.state is not ProcessState.STARTING):
                group.settled_at = now  # ready (or it could not start: not waited for)
            if self._shrink(group, now):
                continue
            wanting = [t for t in group.spec.types if t in full]
            if not wanting or self.workers.size(group.name) >= group.high:
                continue
            for t in wanting:  # enough to tell a backlog larger than the processes starting
                ask[t] = max(ask.get(t, 0), group.high * group.spec.slots)
            self._wanting[group.name] = wanting
        if ask and self.queue.connected:  # decided when the count comes (counted)
            self._asking = now
            self.queue.request_backlog(ask, GROW_WAIT)
        else:  # on the on-demand requests alone
            self.backlog, self.backlog_asked = {}, -math.inf
            self._grow_wanting(now)

    def _grow_wanting(self, now: float) -> None:
        for name, wanting in self._wanting.items():
            group = self.groups.get(name)
            if group is not None:  # (a reload may have taken it out of the autoscaled ones)
                self._grow(group, wanting, now)

    def _grow(self, group: GroupScale, wanting: list[str], now: float) -> None:
        """One more process for `group` if jobs of the types it runs (`wanting`: those with no
        compatible slot free) have waited GROW_WAIT or more, more of them than the slots of
        its processes on their way up will take. One process at a time: not before the last
        one started has been ready GROW_SETTLE seconds, and the queued jobs as counted since
        then, so that a backlog the new process is draining calls for no more; nor within
        idle_timeout of its last shrink (see `_shrink`)."""
        if (now - group.shrunk_at < group.spec.idle_timeout
                or self.workers.warming(group.name)):
            return
        settled = -math.inf
        if group.newest is not None:
            if group.settled_at is None or now - group.settled_at < GROW_SETTLE:
                return
            settled = group.settled_at + GROW_SETTLE
        since = time.time() - GROW_WAIT
        requests = sum(1 for req in self.planner.waiting_requests()
                       if req.type in wanting and req.eligible_at <= since)
        queued = (sum(self.backlog.get(t, 0) for t in wanting)
                  if self.backlog_asked >= settled else 0)
        if requests + queued <= self.workers.starting_slots(group.name):
            return
        size = self.workers.size(group.name) + 1
        proc = self.workers.grow(group.spec)
        group.grown_at = now
        group.newest, group.settled_at = proc, None
        log.info("group %s grows to %d processes (%d..%d): %d queued and %d on-demand jobs "
                 "waiting with no slot free; starting %s", group.name, size, group.low,
                 group.high, queued, requests, proc.name,
                 extra=fields(event="group_scaled", group=group.name, processes=size,
                              direction="up", worker=proc.name))
        self.observer.group_scaled(group.name, size, "up")

    def _shrink(self, group: GroupScale, now: float) -> bool:
        """Stop one process of `group` that has been idle idle_timeout seconds (the highest
        numbered), when it has more than MIN and none is leaving already; whether it did.

        Together with `_grow`, this keeps a group from flapping: after a change in one
        direction, none in the other comes within idle_timeout. A shrink needs a process
        idle for idle_timeout, and every process was busy when the group last grew (the
        group grows only with no compatible slot free), so a shrink comes idle_timeout after
        a growth at the earliest; and a growth waits idle_timeout after a shrink."""
        idle_timeout = group.spec.idle_timeout
        if (self.workers.size(group.name) <= group.low or self.workers.leaving(group.name)
                or now - group.grown_at < idle_timeout):
            return False
        proc = self.workers.idle_process(group.name, idle_timeout, now)
        if proc is None:
            return False
        size = self.workers.size(group.name) - 1
        idle = now - proc.life.active_at
        self.workers.scale_down(proc)
        group.shrunk_at = now
        log.info("group %s shrinks to %d process%s (%d..%d): %s idle for %.1f s "
                 "(idle_timeout %g s); stopping it", group.name, size, "" if size == 1 else "es",
                 group.low, group.high, proc.name, idle, idle_timeout,
                 extra=fields(event="group_scaled", group=group.name, processes=size,
                              direction="down", worker=proc.name))
        self.observer.group_scaled(group.name, size, "down")
        return True
