"""fetch: the best candidates by score per type (design property 2), read through the index."""

from __future__ import annotations

import asyncio
import json
import re

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql as pgsql

from fairsched.store.aqueue import AsyncStore
from fairsched.store.rows import Candidate
from fairsched.store.statements import FETCH_SQL, NEXT_ELIGIBLE_SQL

PPS = 1024 / 16  # W_p / W_a with the default weights


def add_jobs(url: str, jobs: list[tuple[str, int, float]]) -> list[int]:
    """Insert (type, priority, age in seconds; negative: delayed) and return the ids."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "INSERT INTO fairsched_jobs (type, priority, run_after)"
            " SELECT t, p, now() - a * interval '1 second'"
            " FROM unnest(%s::text[], %s::smallint[], %s::float8[]) WITH ORDINALITY AS u(t, p, a, o)"
            " ORDER BY o RETURNING id",
            ([j[0] for j in jobs], [j[1] for j in jobs], [j[2] for j in jobs])).fetchall()
    return [r[0] for r in rows]


def fetch(url: str, free: dict[str, int], pps: float = PPS):
    async def go():
        store = await AsyncStore.connect(url)
        try:
            return await store.fetch(free, pps)
        finally:
            await store.close()
    return asyncio.run(go())


def expected_best(url: str, free: dict[str, int], pps: float) -> list[int]:
    """Brute force: every eligible pending job, ranked by the score key in Python."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT id, type, priority, extract(epoch FROM run_after)::float8 FROM fairsched_jobs"
            " WHERE status = 'pending' AND run_after <= now()").fetchall()
    chosen = []
    for type_name, n in free.items():
        ranked = sorted((r for r in rows if r[1] == type_name), key=lambda r: (r[3] - r[2] * pps, r[0]))
        chosen += ranked[:2 * n]
    return sorted(chosen, key=lambda r: (r[3] - r[2] * pps, r[0]))


def test_an_old_priority_0_job_is_not_left_out_by_newer_priority_10_jobs(db):
    # 10 priority levels x 64 s: after 640 s the priority-0 job outranks fresh priority-10 jobs.
    (old,) = add_jobs(db, [("pdf", 0, 700.0)])
    add_jobs(db, [("pdf", 10, 1.0)] * 200)
    got = fetch(db, {"pdf": 1})
    assert len(got) == 2
    assert got[0].id == old
    assert [j.priority for j in got] == [0, 10]


def test_a_younger_priority_0_job_waits_behind_priority_10(db):
    add_jobs(db, [("pdf", 0, 600.0)])
    add_jobs(db, [("pdf", 10, 1.0)] * 5)
    assert [j.priority for j in fetch(db, {"pdf": 2})] == [10, 10, 10, 10]


def test_fetch_reads_only_eligible_jobs_of_the_types_asked(db):
    ids = add_jobs(db, [("pdf", 5, 1.0), ("pdf", 9, -60.0), ("xls", 5, 1.0), ("idx", 5, 1.0)])
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("UPDATE fairsched_jobs SET status = 'running' WHERE type = 'idx'")
    got = fetch(db, {"pdf": 1, "xls": 0, "idx": 3})
    assert [j.id for j in got] == [ids[0]]
    assert fetch(db, {}) == []


def test_fetch_returns_what_scoring_needs_and_no_payload(db):
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("INSERT INTO fairsched_jobs (type, priority, payload, max_attempts, attempts)"
                     " VALUES ('pdf', 3, %s, 4, 1)", (json.dumps({"doc": "x" * 10000}),))
        (job_id, epoch) = conn.execute(
            "SELECT id, extract(epoch FROM run_after)::float8 FROM fairsched_jobs").fetchone()
    (job,) = fetch(db, {"pdf": 1})
    assert job == Candidate(job_id, "pdf", 3, epoch)  # the payload comes with the claim


@pytest.mark.parametrize("plan_mode", ["force_custom_plan", "force_generic_plan"])
def test_fetch_is_an_index_only_scan(db, plan_mode):
    """Every column a candidate needs is in the fetch index: the payloads (large ones live in
    TOAST) are never read, and heap pages only where their visibility is not yet known."""
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("INSERT INTO fairsched_jobs (type, priority, payload)"
                     " SELECT 'pdf', i % 11, jsonb_build_object('doc', repeat('x', 3000))"
                     " FROM generate_series(1, 2000) AS i")
        conn.execute("VACUUM ANALYZE fairsched_jobs")
        plan = explain_prepared(conn, FETCH_SQL, {"types": ["pdf"], "limits": [32], "pps": 1.0,
                                                    "half_life": 600.0},
                                plan_mode)
    scans = [n for n in plan_nodes(plan) if n.get("Relation Name") == "fairsched_jobs"]
    assert scans and all(n["Node Type"] == "Index Only Scan" for n in scans), scans


jobs_strategy = st.lists(
    st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 10),
              st.one_of(st.floats(0, 2000, allow_nan=False), st.floats(-100, -1))),
    max_size=60)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=jobs_strategy, free_a=st.integers(0, 4), free_b=st.integers(0, 4),
       pps=st.sampled_from([0.0, 1.0, 64.0, 1000.0]))
def test_fetch_equals_the_brute_force_best_by_score(database_url, jobs, free_a, free_b, pps):
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("TRUNCATE fairsched_jobs")
    add_jobs(database_url, jobs)
    free = {"a": free_a, "b": free_b}
    got = fetch(database_url, free, pps)
    want = expected_best(database_url, {t: n for t, n in free.items() if n}, pps)
    assert [j.id for j in got] == [r[0] for r in want]


def plan_nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def explain_prepared(conn, statement: str, params: dict, plan_mode: str) -> dict:
    """EXPLAIN ANALYZE a statement the way the supervisor runs it: prepared (psycopg prepares
    it after a few executions), which under force_generic_plan is planned once for any
    parameters. An EXPLAIN of the statement's text would plan it for these values each time."""
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))
    numbered = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", statement)
    args = pgsql.SQL(", ").join(pgsql.Literal(params[name]) for name in names)
    with conn.transaction(force_rollback=True):
        conn.execute(f"SET LOCAL plan_cache_mode = {plan_mode}")
        # The parameter types psycopg gives them; it deallocates what it prepared once the
        # block is rolled back, so the statement is prepared again by hand, with those types.
        with conn.transaction(force_rollback=True):
            conn.execute(statement, params, prepare=True)
            (types,) = conn.execute("SELECT parameter_types::text[] FROM pg_prepared_statements"
                                    " ORDER BY prepare_time DESC LIMIT 1").fetchone()
        conn.execute(f"PREPARE explained ({', '.join(types)}) AS {numbered}")
        try:
            (doc,) = conn.execute(pgsql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE explained({})")
                                  .format(args)).fetchone()
        finally:
            conn.execute("DEALLOCATE explained")
    return doc[0]["Plan"]


def explain(conn, sql: str, params: dict | None) -> list[dict]:
    (doc,) = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()
    return list(plan_nodes(doc[0]["Plan"]))


@pytest.fixture
def big_queue(db):
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO fairsched_jobs (type, priority, status, run_after)"
            " SELECT 't' || (i % 20), i % 11,"
            "        CASE WHEN i % 4 = 0 THEN 'pending' ELSE 'succeeded' END,"
            "        now() - (i % 5000) * interval '1 second' + (i % 7) * interval '1 minute'"
            " FROM generate_series(1, 40000) AS i")
        conn.execute("ANALYZE fairsched_jobs")
        yield conn


def test_the_fetch_uses_the_partial_index_and_no_table_scan(big_queue):
    nodes = explain(big_queue, FETCH_SQL, {"types": ["t0", "t4", "t8"], "limits": [4, 2, 8],
                                           "pps": PPS, "half_life": 600.0})
    scans = [(n["Node Type"], n.get("Index Name")) for n in nodes
             if n.get("Relation Name") == "fairsched_jobs"]
    assert scans and all(index == "fairsched_jobs_fetch_tenant" for _, index in scans), scans
    assert not any(kind == "Seq Scan" for kind, _ in scans)


def test_the_next_eligible_lookup_uses_the_index(big_queue):
    nodes = explain(big_queue, NEXT_ELIGIBLE_SQL, None)
    scans = [(n["Node Type"], n.get("Index Name")) for n in nodes
             if n.get("Relation Name") == "fairsched_jobs"]
    assert scans and not any(kind == "Seq Scan" for kind, _ in scans), scans
