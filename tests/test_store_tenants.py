"""Tenants in the job table: enqueue's tenant, the fetch's per-tenant best (property 2 with the
tenant term) and the usage completions add, decayed with the half-life."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairsched import core
from fairsched.store.aqueue import AsyncStore
from tests.test_store_fetch import fetch


def add_jobs(url: str, jobs: list[tuple[str, str | None, int, float]]) -> list[int]:
    """Insert (type, tenant, priority, age in seconds; negative: delayed); return the ids."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "INSERT INTO fairsched_jobs (type, tenant, priority, run_after)"
            " SELECT t, n, p, now() - a * interval '1 second'"
            " FROM unnest(%s::text[], %s::text[], %s::smallint[], %s::float8[])"
            "      WITH ORDINALITY AS u(t, n, p, a, o)"
            " ORDER BY o RETURNING id",
            ([j[0] for j in jobs], [j[1] for j in jobs], [j[2] for j in jobs],
             [j[3] for j in jobs])).fetchall()
    return [r[0] for r in rows]


def test_enqueue_stores_the_tenant_and_refuses_a_bad_name(queue):
    q = queue
    a = q.enqueue("pdf", tenant="acme")
    b = q.enqueue("pdf")
    with pytest.raises(ValueError, match="invalid tenant 'no spaces': a tenant name is"):
        q.enqueue("pdf", tenant="no spaces")
    with pytest.raises(ValueError, match="invalid tenant ''"):
        q.enqueue("pdf", tenant="")
    jobs = {j["id"]: j for j in q.list_jobs()}
    assert jobs[a]["tenant"] == "acme"
    assert jobs[b]["tenant"] is None


def test_a_flooding_tenant_does_not_crowd_the_others_out_of_the_fetch(db):
    add_jobs(db, [("pdf", "flood", 0, 100.0 - i * 0.01) for i in range(300)])
    (other,) = add_jobs(db, [("pdf", "small", 0, 1.0)])
    (default,) = add_jobs(db, [("pdf", None, 0, 0.5)])
    got = fetch(db, {"pdf": 1})
    # The two best of each tenant: without tenants the flood's two oldest would be all.
    assert len(got) == 4
    assert {j.id for j in got} >= {other, default}
    assert {j.tenant for j in got} == {"flood", "small", None}


def score_order(rows, usage, now):
    """What the planner makes of fetched rows: the core's order, tenant term included."""
    tenant_ids: dict[str, int] = {}
    for r in rows:
        tenant_ids.setdefault(r[1] or "", len(tenant_ids))
    total = sum(usage.get(t, 0.0) for t in tenant_ids)
    shares = [min(1.0, usage.get(t, 0.0) / total) if total else 0.0 for t in tenant_ids]
    cands = core.Candidates.from_lists(
        [0] * len(rows), [r[2] for r in rows], [r[3] for r in rows], [False] * len(rows),
        [r[0] for r in rows], tenants=[tenant_ids[r[1] or ""] for r in rows],
        tenant_shares=shares)
    _, order = core.score_candidates(cands, now, [1], core.Weights())
    return [rows[i][0] for i in order]


jobs_strategy = st.lists(
    st.tuples(st.sampled_from(["a", "b", None]), st.integers(0, 10),
              st.one_of(st.floats(0, 2000, allow_nan=False), st.floats(-100, -1))),
    max_size=50)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=jobs_strategy, free=st.integers(1, 4),
       usage=st.fixed_dictionaries({"a": st.floats(0, 100), "b": st.floats(0, 100),
                                    "": st.floats(0, 100)}))
def test_the_best_job_by_score_with_tenants_is_always_fetched(database_url, jobs, free, usage):
    """Property 2 with the tenant term: whatever the usage, the k best jobs of the type by the
    full score (tenant term included) are among those fetched."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("TRUNCATE fairsched_jobs, fairsched_tenant_usage")
        conn.execute("INSERT INTO fairsched_tenant_usage (tenant, usage, updated_at)"
                     " SELECT * FROM unnest(%s::text[], %s::float8[]), now()",
                     (list(usage), list(usage.values())))
        (now,) = conn.execute("SELECT extract(epoch FROM now())::float8").fetchone()
        add_jobs(database_url, [("pdf", t, p, a) for t, p, a in jobs])
        every = conn.execute(
            "SELECT id, tenant, priority, extract(epoch FROM run_after)::float8"
            " FROM fairsched_jobs WHERE status = 'pending' AND run_after <= now()").fetchall()
    got = fetch(database_url, {"pdf": free})
    fetched = {j.id for j in got}
    best = score_order(every, usage, now)[:2 * free]
    assert set(best) <= fetched
    # and each row carries its tenant's usage (decayed by a few milliseconds at most)
    for j in got:
        assert j.usage == pytest.approx(usage[j.tenant or ""], rel=1e-3, abs=1e-9)


def test_completions_add_slot_seconds_to_the_tenants_usage_decayed(db):
    async def go():
        store = await AsyncStore.connect(db)
        store.usage_half_life = 10.0
        try:
            with psycopg.connect(db, autocommit=True) as conn:
                # 20 s ago, 8 slot-seconds: two half-lives later they are 2.
                conn.execute("INSERT INTO fairsched_tenant_usage VALUES"
                             " ('acme', 8, now() - interval '20 seconds')")
            ids = add_jobs(db, [("pdf", "acme", 0, 1.0), ("pdf", None, 0, 1.0)])
            won = await store.claim(ids, {})
            with psycopg.connect(db, autocommit=True) as conn:
                conn.execute("UPDATE fairsched_jobs SET started_at = now() - interval '3 seconds'")
            done = await store.complete([(j.id, j.claim, None) for j in won])
            assert sorted(done) == sorted(ids)
        finally:
            await store.close()
    asyncio.run(go())
    with psycopg.connect(db) as conn:
        usage = dict(conn.execute("SELECT tenant, usage FROM fairsched_tenant_usage").fetchall())
    assert usage["acme"] == pytest.approx(2.0 + 3.0, abs=0.05)
    assert usage[""] == pytest.approx(3.0, abs=0.05)


def test_failed_and_cancelled_attempts_count_toward_the_usage_as_successes_do(db):
    """A tenant whose jobs fail (retried or for good) or are cancelled has taken its slots all
    the same: its slot-seconds go to its usage."""
    async def go():
        store = await AsyncStore.connect(db)
        try:
            ids = add_jobs(db, [("pdf", "retried", 0, 1.0), ("pdf", "dead", 0, 1.0),
                                ("pdf", "stopped", 0, 1.0)])
            won = {j.id: j for j in await store.claim(ids, {})}
            with psycopg.connect(db, autocommit=True) as conn:
                conn.execute("UPDATE fairsched_jobs SET started_at = now() - interval '4 seconds'")
            retried, dead, stopped = ids
            assert await store.fail(retried, won[retried].claim, "flaky", permanent=False,
                                    retry_delay=60) == "pending"
            assert await store.fail(dead, won[dead].claim, "broken", permanent=True,
                                    retry_delay=0) == "failed"
            assert await store.cancel_finish(stopped, won[stopped].claim) == "cancelled"
            # A failure the fence turns away (no longer this claim's) adds nothing.
            assert await store.fail(dead, won[dead].claim, "again", permanent=True,
                                    retry_delay=0) is None
        finally:
            await store.close()
    asyncio.run(go())
    with psycopg.connect(db) as conn:
        usage = dict(conn.execute("SELECT tenant, usage FROM fairsched_tenant_usage").fetchall())
    assert usage == {"retried": pytest.approx(4.0, abs=0.05), "dead": pytest.approx(4.0, abs=0.05),
                     "stopped": pytest.approx(4.0, abs=0.05)}


def test_submit_takes_a_tenant_and_refuses_a_bad_one_in_one_line(db, tmp_path):
    from tests.test_cli_queue import WORKERS_TOML, fairsched
    from tests.test_cli_queue import queue as cli_queue

    config = tmp_path / "workers.toml"
    config.write_text(WORKERS_TOML)
    done = fairsched("submit", "pdf", "--tenant", "acme", "--config", str(config), url=db)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    with cli_queue(db) as q:
        assert q.get_job(int(done.stdout))["tenant"] == "acme"
    bad = fairsched("submit", "pdf", "--tenant", "a b", "--config", str(config), url=db)
    assert (bad.returncode, bad.stderr.count("\n")) == (2, 1), bad.stderr
    assert "invalid tenant 'a b': a tenant name is letters, digits" in bad.stderr
    od = fairsched("submit", "pdf", "--tenant", "acme", "--on-demand", "--config", str(config),
                   url=db)
    assert od.returncode == 2
    assert "--tenant applies to queued jobs, not to --on-demand" in od.stderr
