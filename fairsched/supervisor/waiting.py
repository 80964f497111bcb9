"""The jobs waiting for a slot: on-demand requests and the queued jobs fetched but not yet
claimed, held in the core's candidate cache, which plans each cycle from them; and the queued
jobs whose claim is on its way."""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterable, Mapping

from fairsched import core
from fairsched.supervisor.in_flight import Request


class WaitingJobs:
    def __init__(self, type_ids: Mapping[str, int], cache=None):
        self.type_ids = type_ids
        self.cache = core.CandidateCache() if cache is None else cache
        # Tenants by id as the core knows them (the default tenant is ''), and each one's
        # usage as the last fetch that found a job of it read it, and when (monotonic).
        self.tenant_ids: dict[str, int] = {}
        self.usage = array("d")
        self.usage_at = array("d")

    # -- on-demand requests --------------------------------------------------------------------

    def add_request(self, req: Request) -> None:
        """Wait for a slot (again: a retry's eligible_at is read anew)."""
        self.cache.add(req.core_id, req.type_id, req.priority, req.eligible_at, True, req)

    def drop_request(self, req: Request) -> bool:
        """Stop waiting; False when it was not."""
        return self.cache.remove(req.core_id)

    def requests(self) -> list[Request]:
        """The waiting requests, oldest first."""
        return sorted(self.cache.jobs_of(on_demand=True), key=lambda req: req.number)

    @property
    def n_requests(self) -> int:
        return self.cache.n_on_demand

    # -- queued jobs ---------------------------------------------------------------------------

    def add_fetched(self, rows: Iterable, busy: set[int]) -> None:
        """Keep the candidates a fetch found, but those `busy` (running, or claimed since)."""
        # A type no worker here runs could never be planned: not kept.
        type_ids = self.type_ids
        kept = [(qj, type_ids[qj.type]) for qj in rows
                if qj.id not in busy and qj.type in type_ids]
        self.cache.add_many([qj.id for qj, _ in kept], [tid for _, tid in kept],
                            [qj.priority for qj, _ in kept], [qj.eligible_at for qj, _ in kept],
                            [qj for qj, _ in kept],
                            tenants=[self._tenant_id(qj.tenant, qj.usage) for qj, _ in kept])

    def _tenant_id(self, tenant: str | None, usage: float) -> int:
        tid = self.tenant_ids.setdefault(tenant or "", len(self.tenant_ids))
        if tid == len(self.usage):
            self.usage.append(0.0)
            self.usage_at.append(0.0)
        self.usage[tid] = max(0.0, usage)
        self.usage_at[tid] = time.monotonic()
        return tid

    def tenant_shares(self, half_life: float) -> array:
        """Each tenant's share of the usage of the tenants known (0 .. 1, by tenant id), each
        usage decayed since the fetch that read it, so that one read long ago weighs as
        little as it would now."""
        now = time.monotonic()
        usage = [u * 2.0 ** -((now - at) / half_life) if u else 0.0
                 for u, at in zip(self.usage, self.usage_at, strict=True)]
        total = sum(usage)
        if total <= 0.0:
            return array("d", bytes(8 * len(usage)))
        return array("d", [min(1.0, u / total) for u in usage])

    def forget(self, type_name: str | None = None) -> None:
        """Drop the queued candidates of `type_name` (of every type with None)."""
        if type_name is None:
            self.cache.forget_queued()
        elif type_name in self.type_ids:
            self.cache.forget_type(self.type_ids[type_name])

    def clear(self) -> None:
        """Drop every request and candidate (the claims on their way stay)."""
        self.cache.clear()

    def has_queued(self, type_name: str) -> bool:
        tid = self.type_ids.get(type_name)
        return tid is not None and self.cache.queued_of(tid) > 0

    # -- a cycle, and the claims it makes ------------------------------------------------------

    def plan(self, pool, now: float, weights, offset: float, queued: bool, matching: str,
             half_life: float = 600.0):
        """Place the best candidates (queued ones only with `queued`); the placed leave.
        Returns (requests, their slot ids, queued job ids, their slot ids), each in score
        order; the queued jobs are being claimed until end_claim(). `half_life`: the tenants'
        usage's ([scoring] usage_half_life)."""
        return self.cache.plan(pool, now, weights, offset, queued, matching,
                               tenant_shares=self.tenant_shares(half_life))

    def cancel_claim(self, job_id) -> bool:
        """A cancel for a job whose claim is on its way: remembered (True), else False."""
        return self.cache.cancel_claim(job_id)

    def end_claim(self, job_id: int) -> bool:
        """The claim's answer came: whether a cancel came meanwhile."""
        return self.cache.end_claim(job_id)
