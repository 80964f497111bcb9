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
        # Property 2 with tenants: the cached jobs of a type are its best only while each
        # tenant whose fetch came back full (it may have more) still has some cached. Rows
        # cached by (type, tenant id), the pairs that came back full, and the types where
        # one such tenant has none left: those are looked at afresh.
        self._row_key: dict[int, tuple[str, int]] = {}
        self._cached: dict[tuple[str, int], int] = {}
        self._full: set[tuple[str, int]] = set()
        self._ran_out: set[str] = set()

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

    def add_fetched(self, rows: Iterable, busy: set[int],
                    per_tenant: Mapping[str, int] | None = None) -> None:
        """Keep the candidates a fetch found, but those `busy` (running, or claimed since).
        `per_tenant`: by type, the most jobs the fetch read of one tenant."""
        # A type no worker here runs could never be planned: not kept.
        type_ids = self.type_ids
        rows = list(rows)
        found: dict[tuple[str, int], int] = {}
        tenants = []
        for qj in rows:
            key = (qj.type, self._tenant_id(qj.tenant, qj.usage))
            found[key] = found.get(key, 0) + 1
            tenants.append(key)
        if per_tenant:
            self._full.update(k for k, n in found.items() if n >= per_tenant.get(k[0], n + 1))
        kept = [(qj, type_ids[qj.type], key) for qj, key in zip(rows, tenants, strict=True)
                if qj.id not in busy and qj.type in type_ids]
        for qj, _, key in kept:
            if self._row_key.get(qj.id) is None:
                self._cached[key] = self._cached.get(key, 0) + 1
            self._row_key[qj.id] = key
        self.cache.add_many([qj.id for qj, _, _ in kept], [tid for _, tid, _ in kept],
                            [qj.priority for qj, _, _ in kept],
                            [qj.eligible_at for qj, _, _ in kept], [qj for qj, _, _ in kept],
                            tenants=[key[1] for _, _, key in kept])

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
            self._forget_tenants(None)
        elif type_name in self.type_ids:
            self.cache.forget_type(self.type_ids[type_name])
            self._forget_tenants(type_name)

    def _forget_tenants(self, type_name: str | None) -> None:
        if type_name is None:
            self._row_key.clear()
            self._cached.clear()
            self._full.clear()
            self._ran_out.clear()
            return
        self._row_key = {i: k for i, k in self._row_key.items() if k[0] != type_name}
        self._cached = {k: n for k, n in self._cached.items() if k[0] != type_name}
        self._full = {k for k in self._full if k[0] != type_name}
        self._ran_out.discard(type_name)

    def clear(self) -> None:
        """Drop every request and candidate (the claims on their way stay)."""
        self.cache.clear()
        self._forget_tenants(None)

    def has_queued(self, type_name: str) -> bool:
        """Whether the cached jobs of the type are known to be its best: some are cached, and
        no tenant that may have more has run out of cached ones."""
        tid = self.type_ids.get(type_name)
        return (tid is not None and self.cache.queued_of(tid) > 0
                and type_name not in self._ran_out)

    # -- a cycle, and the claims it makes ------------------------------------------------------

    def plan(self, pool, now: float, weights, offset: float, queued: bool, matching: str,
             half_life: float = 600.0):
        """Place the best candidates (queued ones only with `queued`); the placed leave.
        Returns (requests, their slot ids, queued job ids, their slot ids), each in score
        order; the queued jobs are being claimed until end_claim(). `half_life`: the tenants'
        usage's ([scoring] usage_half_life)."""
        placed = self.cache.plan(pool, now, weights, offset, queued, matching,
                                 tenant_shares=self.tenant_shares(half_life))
        for job_id in placed[2]:
            key = self._row_key.pop(job_id, None)
            if key is not None:
                left = self._cached[key] = self._cached[key] - 1
                if not left and key in self._full:
                    self._ran_out.add(key[0])
        return placed

    def cancel_claim(self, job_id) -> bool:
        """A cancel for a job whose claim is on its way: remembered (True), else False."""
        return self.cache.cancel_claim(job_id)

    def end_claim(self, job_id: int) -> bool:
        """The claim's answer came: whether a cancel came meanwhile."""
        return self.cache.end_claim(job_id)
