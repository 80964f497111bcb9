"""Whatever JSON a handler returns is stored and given back as it was, queued or on demand:
NUL characters in strings and in object keys, lone surrogates, numbers jsonb would write
otherwise. Finished work is never thrown away because its result could not be stored."""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest

from fairsched.store.aqueue import AsyncStore
from fairsched.store.queue import Queue
from fairsched.store.rows import RESULT_AS_TEXT, encode_result
from tests.supervisor_harness import wait_until

# Each one failed its queued job: "result contains a NUL character, which PostgreSQL jsonb
# cannot store" (or a lone surrogate), or came back changed (1e+23 as an integer).
AWKWARD = {
    "title ending in NUL": {"pages": 3, "title": "Quarterly report\x00"},
    "NUL in keys, nested": {"meta\x00": {"a\x00b": ["\x00", {"\x00": "x\x00y"}]}, "ok": 1},
    "a NUL string alone": "\x00",
    "lone surrogate": {"text": "a broken \ud800 pair"},
    "NUL and a surrogate pair": ["\x00😀", "é\x00"],
    "large float": {"bytes": 1e23, "small": 1.5e-07},
    "negative zero": [-0.0, 0.0],
    "the stored form itself": {RESULT_AS_TEXT: "[1, 2]"},
}
PLAIN = {"pages": 3, "title": "Quarterly report", "tags": ["a", "é"], "n": 1.5}


def same(a, b) -> bool:
    """Equal as JSON, each number of the same type and sign, keys in any order."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) and a == b


def store_results(url: str, results: list) -> list[int]:
    """Enqueue a job per result, claim them all and complete each with its result."""
    with psycopg.connect(url, autocommit=True) as conn:
        ids = Queue(conn).enqueue_many([{"type": "pdf"}] * len(results))

    async def complete():
        store = await AsyncStore.connect(url)
        try:
            won = await store.claim(ids, {"pdf": 1})
            assert [j.id for j in won] == ids
            return await store.complete([(j.id, j.claim, encode_result(r))
                                         for j, r in zip(won, results, strict=True)])
        finally:
            await store.close()

    assert sorted(asyncio.run(complete())) == ids
    return ids


def test_every_read_gives_back_the_result_as_the_handler_returned_it(db):
    results = [*AWKWARD.values(), PLAIN, None]
    ids = store_results(db, results)
    with psycopg.connect(db, autocommit=True) as conn:
        queue = Queue(conn)
        listed = {row["id"]: row for row in queue.list_jobs()}
        found = queue.get_jobs(ids)
    for job_id, result in zip(ids, results, strict=True):
        assert found[job_id]["status"] == "succeeded"
        assert same(found[job_id]["result"], result), (found[job_id]["result"], result)
        assert same(listed[job_id]["result"], result)


def test_a_plain_result_stays_plain_jsonb_for_queries(db):
    (plain, awkward) = store_results(db, [PLAIN, AWKWARD["title ending in NUL"]])
    with psycopg.connect(db) as conn:
        rows = dict(conn.execute("SELECT id, result->>'title' FROM fairsched_jobs").fetchall())
    assert rows[plain] == "Quarterly report"
    assert rows[awkward] is None  # kept as its JSON text: what jsonb cannot hold as it is


SUPERVISED = """
[[worker]]
name = "ret"
types = ["ret"]
handler = "sup_handlers:returns"
slots = 4
"""


@pytest.mark.parametrize("name", list(AWKWARD), ids=range(len(AWKWARD)))
def test_queued_and_on_demand_jobs_give_back_the_same_result(supervisors, name):
    sup = supervisors(SUPERVISED).start()
    result = AWKWARD[name]
    payload = {"json": json.dumps(result)}
    queued = sup.enqueue("ret", payload=payload)
    shown = {}

    def finished():
        listed = sup.cli("jobs", str(queued), "--json")
        assert listed.returncode == 0, listed.stderr
        (row,) = json.loads(listed.stdout)
        shown.update(row)
        return row["status"] in ("succeeded", "failed", "cancelled")

    wait_until(finished, 30, lambda: f"job {queued} to end: {shown}\n{sup.output()[-2000:]}")
    assert shown["status"] == "succeeded", shown["last_error"]
    assert same(shown["result"], result), (shown["result"], result)
    on_demand = sup.cli("submit", "ret", "--on-demand", "--payload", json.dumps(payload))
    assert on_demand.returncode == 0, on_demand.stderr
    assert same(json.loads(on_demand.stdout), result)
    assert "could not be stored" not in sup.output()


def test_a_result_over_the_frame_cap_fails_naming_the_cap(supervisors, db):
    sup = supervisors('[[worker]]\nname = "big"\ntypes = ["big"]\nhandler = "sup_handlers:big"\n'
                      "max_attempts = 3\n").start()
    big = sup.enqueue("big", payload={"size": 2_000_000})

    def ended():
        with psycopg.connect(db) as conn:
            return conn.execute("SELECT status, attempts, last_error FROM fairsched_jobs"
                                " WHERE id = %s AND status <> 'running' AND status <> 'pending'",
                                (big,)).fetchone()

    status, attempts, error = wait_until(ended, 30, "the big result's job to end")
    assert (status, attempts) == ("failed", 1)  # the same result again would be as large
    assert error.startswith("result is too large: frame of ")
    assert error.endswith("bytes exceeds the 1048576-byte limit")
