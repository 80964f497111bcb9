"""The roll of a reload: the processes of groups whose settings changed are replaced one at a
time, across every group, so that no type loses more than one process of capacity at once.
Owned by the workers component (workers.py), whose processes it asks to retire."""

from __future__ import annotations

import collections
import logging

from fairsched.logs import fields
from fairsched.supervisor.states import ProcessState

log = logging.getLogger("fairsched.supervisor")


class Rolling:
    """Owns the processes waiting to be replaced (`queue`, each with the first generation
    that counts as replaced) and the one being replaced now (`current`)."""

    def __init__(self, workers, run):
        self.workers = workers
        self.run = run  # RunState: the actor's, read only
        self.queue: collections.deque = collections.deque()
        self.current: tuple | None = None

    def add(self, procs, since: int) -> None:
        """Replace `procs`, each unless an incarnation of generation `since` or later (one
        started with the new settings: restarted meanwhile) is running already."""
        # One queued already, by an earlier reload, now counts as replaced from `since` only.
        again = {id(proc) for proc in procs}
        self.queue = collections.deque((p, since if id(p) in again else s)
                                       for p, s in self.queue)
        queued = {id(proc) for proc, _ in self.queue}
        self.queue.extend((proc, since) for proc in procs if id(proc) not in queued)

    def step(self) -> None:
        """Go on: once the process being replaced has said hello with its new settings, retire
        the next (its group's template, reloaded, must have imported the handler first: the
        replacement is forked from it)."""
        if self.run.shutting_down:
            return
        workers = self.workers
        while True:
            if self.current is not None:
                proc, since = self.current
                if proc.removed or proc not in workers.procs:
                    self.current = None
                elif proc.state is ProcessState.FATAL:
                    self._abandon(proc)
                elif (proc.life.generation >= since and proc.state is ProcessState.RUNNING
                      and proc.life.slot_ids):
                    log.info("worker %s replaced (pid %d)", proc.name, proc.life.pid,
                             extra=fields(event="worker_replaced", worker=proc.name,
                                          group=proc.group, pid=proc.life.pid))
                    self.current = None
                else:
                    return  # on its way: its hello (or its end) steps on
                continue
            if not self.queue:
                return
            proc, since = self.queue[0]
            if proc.removed or proc not in workers.procs or (
                    proc.life.generation >= since and proc.state is not ProcessState.DOWN):
                self.queue.popleft()  # gone, or restarted with the new settings meanwhile
                continue
            if workers.warming(proc.group):
                return  # the new code imports: the replacement would have to wait for it
            self.queue.popleft()
            self.current = (proc, since)
            workers.retire(proc)

    def _abandon(self, proc) -> None:
        """The replacement cannot run (fatal): the group's other processes are left as they
        are, running what they ran, rather than replaced by more that cannot."""
        left = [p for p, _ in self.queue if p.group == proc.group]
        self.queue = collections.deque((p, s) for p, s in self.queue if p.group != proc.group)
        self.current = None
        if left:
            log.error("reload of group %s stopped: its new process %s is fatal (%s); %s keep "
                      "running as they were until it is fixed (`fairsched reload` or "
                      "`fairsched restart %s`)", proc.group, proc.name, proc.fatal_reason,
                      ", ".join(p.name for p in left), proc.group)
