"""The synchronous Queue: enqueue, idempotency keys, validation, listing, retry and cancel."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import psycopg
import pytest

from fairsched.store.errors import DatabaseUnavailable, JobNotFound, JobStateError
from fairsched.store.queue import Queue


def count(queue: Queue) -> int:
    return queue.conn.execute("SELECT count(*) FROM fairsched_jobs").fetchone()[0]


def set_status(queue: Queue, job_id: int, status: str, **fields) -> None:
    assignments = ", ".join(["status = %s"] + [f"{name} = %s" for name in fields])
    queue.conn.execute(f"UPDATE fairsched_jobs SET {assignments} WHERE id = %s",
                       (status, *fields.values(), job_id))


def test_enqueue_stores_the_job_as_given(queue):
    job_id = queue.enqueue("pdf", {"doc": 7, "pages": [1, 2]}, priority=4, max_attempts=2)
    job = queue.get_job(job_id)
    assert job["type"] == "pdf"
    assert job["payload"] == {"doc": 7, "pages": [1, 2]}
    assert (job["priority"], job["max_attempts"], job["attempts"]) == (4, 2, 0)
    assert job["status"] == "pending"
    assert job["run_after"] == job["created_at"]
    assert job["last_error"] is None and job["result"] is None and job["claimed_by"] is None
    assert queue.get_job(job_id + 1000) is None


def test_get_jobs_finds_those_that_exist_in_one_call(queue):
    first, second = queue.enqueue_many([{"type": "pdf", "payload": 1}, {"type": "xlsx"}])
    found = queue.get_jobs([second, second + 1000, first, second])
    assert sorted(found) == [first, second]
    assert (found[first]["payload"], found[second]["type"]) == (1, "xlsx")
    assert queue.get_jobs([]) == {}
    with pytest.raises(ValueError, match="job id must be a positive integer, got 0"):
        queue.get_jobs([first, 0])


def test_a_delay_moves_the_eligible_time(queue):
    job = queue.get_job(queue.enqueue("pdf", delay=90.5))
    assert job["run_after"] - job["created_at"] == timedelta(seconds=90.5)


def test_max_attempts_left_out_means_the_workers_default(queue):
    assert queue.get_job(queue.enqueue("pdf"))["max_attempts"] is None


def test_enqueue_many_returns_ids_in_input_order(queue):
    jobs = [{"type": f"t{i % 3}", "payload": i, "priority": i % 11} for i in range(50)]
    ids = queue.enqueue_many(jobs)
    assert len(set(ids)) == 50
    for job_id, job in zip(ids, jobs, strict=True):
        row = queue.get_job(job_id)
        assert (row["type"], row["payload"], row["priority"]) == (
            job["type"], job["payload"], job["priority"])
    assert queue.enqueue_many([]) == []


def test_a_key_returns_the_unfinished_job_holding_it(queue):
    first = queue.enqueue("mail", {"to": "a"}, key="invoice-17")
    assert queue.enqueue("mail", {"to": "a"}, key="invoice-17") == first
    set_status(queue, first, "running")
    assert queue.enqueue("mail", {"to": "a"}, key="invoice-17") == first
    set_status(queue, first, "succeeded")
    second = queue.enqueue("mail", key="invoice-17")
    assert second != first
    assert queue.get_job(first)["payload"] == {"to": "a"}
    assert count(queue) == 2


def test_keys_inside_one_batch_and_against_the_table(queue):
    existing = queue.enqueue("mail", key="k1")
    ids = queue.enqueue_many([
        {"type": "mail", "key": "k1"},
        {"type": "mail", "key": "k2"},
        {"type": "mail"},
        {"type": "mail", "key": "k2"},
        {"type": "mail", "key": "k3"},
    ])
    assert ids[0] == existing
    assert ids[1] == ids[3]
    assert len({existing, ids[1], ids[2], ids[4]}) == 4
    assert count(queue) == 4


def test_batches_sharing_keys_in_any_order_do_not_deadlock(db):
    # Each batch takes its keys' index entries as it inserts them: in input order, two
    # batches holding the same keys in opposite orders would each wait for the other. Each
    # batch runs in a transaction of its caller's, where enqueue_many cannot run it again: a
    # deadlock would surface here.
    import random
    import threading

    start = threading.Barrier(4)
    found: list[dict] = []
    errors: list[BaseException] = []

    def enqueue(seed: int) -> None:
        try:
            with psycopg.connect(db) as conn:
                for round in range(3):
                    order = [f"r{round}-k{i}" for i in range(3000)]
                    random.Random(seed * 10 + round).shuffle(order)
                    start.wait(10)
                    with conn.transaction():
                        ids = Queue(conn).enqueue_many([{"type": "mail", "key": k}
                                                        for k in order])
                    found.append(dict(zip(order, ids, strict=True)))
        except BaseException as exc:
            errors.append(exc)
            start.abort()

    threads = [threading.Thread(target=enqueue, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [e for e in errors if not isinstance(e, threading.BrokenBarrierError)] == []
    assert len(found) == 12
    for round in range(3):  # one job per key, the same id for every batch that names it
        assert all(ids == found[round * 4] for ids in found[round * 4:round * 4 + 4])
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM fairsched_jobs").fetchone()[0] == 9000


@pytest.mark.parametrize("kwargs, message", [
    ({"priority": 11}, "priority must be an integer from 0 to 10"),
    ({"priority": -1}, "priority must be an integer from 0 to 10"),
    ({"priority": 2.5}, "priority must be an integer from 0 to 10"),
    ({"priority": True}, "priority must be an integer from 0 to 10"),
    ({"max_attempts": 0}, "max_attempts must be an integer from 1 to 2147483647, got 0"),
    ({"max_attempts": 10**40}, "max_attempts must be an integer from 1 to 2147483647, got 1000"),
    ({"delay": -1}, "delay must be a number of seconds"),
    ({"delay": 10**400}, "delay must be a number of seconds from 0 to 315360000, got 1000"),
    ({"delay": float("nan")}, "delay must be a number of seconds"),
    ({"payload": {1, 2}}, "payload is not JSON-serialisable"),
    ({"payload": float("inf")}, "payload is not JSON-serialisable"),
    ({"payload": "nul\x00"}, "payload contains a NUL character"),
    ({"payload": ["\\\x00"]}, "payload contains a NUL character"),  # a backslash, then NUL
    ({"payload": "x" * (1 << 19)}, "payload is 524290 bytes of JSON; at most 524288 fit"),
    ({"key": ""}, "key must be non-empty text"),
    ({"key": "\udcff"}, "key must be non-empty text (UTF-8, no NUL), got '\\udcff'"),
    ({"payload": "\ud800"}, "payload contains a lone surrogate"),
    ({"payload": json.loads("[" * 501 + "]" * 501)}, "payload nests deeper than 500 levels"),
])
def test_bad_arguments_are_one_line_value_errors_and_write_nothing(queue, kwargs, message):
    with pytest.raises(ValueError) as err:
        queue.enqueue("pdf", **kwargs)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)
    assert count(queue) == 0


def test_a_payload_is_measured_in_the_utf8_bytes_its_run_frame_carries(queue):
    from fairsched.protocol import MAX_PAYLOAD, encode_run

    job_id = queue.enqueue("pdf", "é" * 200_000)  # 1.2 MB escaped, 400 KB of UTF-8
    text = queue.conn.execute("SELECT payload::text FROM fairsched_jobs WHERE id = %s",
                              (job_id,)).fetchone()[0]
    assert len(text.encode()) == 400_002
    frame = encode_run("i", 0, job_id, "pdf", 0, 1, False, text)
    assert len(frame) < 400_002 + 200
    assert queue.enqueue("pdf", "😀" * ((MAX_PAYLOAD - 2) // 4))  # fits to the byte
    with pytest.raises(ValueError, match=f"payload is {MAX_PAYLOAD + 2} bytes of JSON; at most"):
        queue.enqueue("pdf", "😀" * ((MAX_PAYLOAD + 2) // 4))


def test_numbers_count_as_jsonb_writes_them_out(queue):
    from fairsched.store.rows import encode_json, stored_size

    numbers = [1e308, -1.5e300, 5e-324, 1e-05, 1.25e-07, 1e16, 123456789.0, 0.1, 10**30]
    job_id = queue.enqueue("pdf", numbers)
    text = queue.conn.execute("SELECT payload::text FROM fairsched_jobs WHERE id = %s",
                              (job_id,)).fetchone()[0]
    assert stored_size(encode_json(numbers, "payload"), numbers) == len(text.replace(" ", ""))
    # 32 KB as given, over a megabyte as stored: a frame could never take it to a worker.
    with pytest.raises(ValueError) as err:
        queue.enqueue("pdf", [1e308] * 4000)
    assert str(err.value).startswith(
        "payload is 1240001 bytes of JSON once its numbers are written out in full, as "
        "PostgreSQL stores them (28001 as compact JSON); at most 524288 fit")
    assert count(queue) == 1


def test_a_backslash_before_u0000_is_text_not_a_nul(queue):
    payload = {"path": "C:\\u0000dir", "regex": "\\\\u0000"}
    job_id = queue.enqueue("pdf", payload)
    assert queue.get_job(job_id)["payload"] == payload


def test_one_bad_job_rejects_the_whole_batch(queue):
    with pytest.raises(ValueError, match="unknown field 'prio'"):
        queue.enqueue_many([{"type": "a"}, {"type": "b", "prio": 3}])
    with pytest.raises(ValueError, match="job 1: invalid job type ''"):
        queue.enqueue_many([{"type": "a"}, {"type": ""}])
    with pytest.raises(ValueError, match="'type' is required"):
        queue.enqueue_many([{"payload": 1}])
    assert count(queue) == 0


@pytest.mark.parametrize("job, message", [
    ({"priority": 11}, "job 1: priority must be an integer from 0 to 10, got 11"),
    ({"max_attempts": 0}, "job 1: max_attempts must be an integer from 1 to 2147483647"),
    ({"delay": -1}, "job 1: delay must be a number of seconds"),
    ({"key": ""}, "job 1: key must be non-empty text"),
    ({"payload": {1, 2}}, "job 1: payload is not JSON-serialisable"),
    ({"payload": "x" * (1 << 19)}, "job 1: payload is 524290 bytes of JSON"),
    ({"payload": json.loads("[" * 501 + "]" * 501)}, "job 1: payload nests deeper than 500"),
    ({"prio": 1}, "job 1: unknown field 'prio'"),
])
def test_every_error_in_a_batch_says_which_job(queue, job, message):
    with pytest.raises(ValueError) as err:
        queue.enqueue_many([{"type": "a"}, {"type": "b", **job}, {"type": "c"}])
    assert str(err.value).startswith(message)
    assert count(queue) == 0


def test_list_jobs_filters_newest_first(queue):
    ids = queue.enqueue_many([{"type": "a"}, {"type": "b"}, {"type": "a"}, {"type": "a"}])
    set_status(queue, ids[3], "failed", last_error="boom")
    assert [j["id"] for j in queue.list_jobs()] == ids[::-1]
    assert [j["id"] for j in queue.list_jobs(type="a")] == [ids[3], ids[2], ids[0]]
    assert [j["id"] for j in queue.list_jobs(status="pending", type="a")] == [ids[2], ids[0]]
    assert [j["last_error"] for j in queue.list_jobs(status="failed")] == ["boom"]
    assert len(queue.list_jobs(limit=2)) == 2
    with pytest.raises(ValueError, match="status must be one of"):
        queue.list_jobs(status="done")
    for limit in (0, 10**30):
        with pytest.raises(ValueError, match="limit must be an integer from 1 to "
                                             "9223372036854775807, got "):
            queue.list_jobs(limit=limit)


def test_retry_puts_a_failed_job_back_with_fresh_attempts(queue):
    job_id = queue.enqueue("pdf")
    set_status(queue, job_id, "failed", attempts=3, max_attempts=3, last_error="boom",
               finished_at=None)
    with psycopg.connect(queue.conn.info.dsn, autocommit=True) as listener:
        listener.execute("LISTEN fairsched_jobs")
        queue.retry_job(job_id)
        notes = [(n.channel, n.payload) for n in listener.notifies(timeout=5, stop_after=1)]
    job = queue.get_job(job_id)
    assert (job["status"], job["attempts"], job["last_error"]) == ("pending", 0, None)
    assert job["max_attempts"] == 3
    assert notes == [("fairsched_jobs", "pdf")]


def test_retry_with_max_attempts_gives_a_new_budget(queue):
    job_id = queue.enqueue("pdf")
    set_status(queue, job_id, "failed", attempts=2, max_attempts=2)
    for bad in (0, 2**31, 2.0, True):
        with pytest.raises(ValueError, match="max_attempts must be an integer from 1 to"):
            queue.retry_job(job_id, max_attempts=bad)
    assert queue.get_job(job_id)["status"] == "failed"
    queue.retry_job(job_id, max_attempts=5)
    job = queue.get_job(job_id)
    assert (job["status"], job["attempts"], job["max_attempts"]) == ("pending", 0, 5)


def test_retry_refuses_unfinished_and_unknown_jobs(queue):
    job_id = queue.enqueue("pdf")
    with pytest.raises(JobStateError, match=f"job {job_id} is pending; only failed or cancelled"):
        queue.retry_job(job_id)
    with pytest.raises(JobNotFound, match="no job with id 999"):
        queue.retry_job(999)
    set_status(queue, job_id, "cancelled")
    queue.retry_job(job_id)
    assert queue.get_job(job_id)["status"] == "pending"


def test_retry_refuses_when_the_key_is_taken_again(queue):
    old = queue.enqueue("mail", key="k")
    set_status(queue, old, "failed")
    new = queue.enqueue("mail", key="k")
    with pytest.raises(JobStateError, match=f"job {new} \\(pending\\) now holds"):
        queue.retry_job(old)
    assert queue.get_job(old)["status"] == "failed"


def test_retry_jobs_puts_every_job_of_a_status_back_in_one_statement(queue):
    failed = [queue.enqueue("pdf") for _ in range(3)]
    other_type = queue.enqueue("ocr")
    cancelled = queue.enqueue("pdf")
    for job_id in failed + [other_type]:
        set_status(queue, job_id, "failed", attempts=3, max_attempts=3, last_error="boom")
    set_status(queue, cancelled, "cancelled")
    with psycopg.connect(queue.conn.info.dsn, autocommit=True) as listener:
        listener.execute("LISTEN fairsched_jobs")
        retried, left = queue.retry_jobs("failed", "pdf", max_attempts=5)
        notes = [(n.channel, n.payload) for n in listener.notifies(timeout=5, stop_after=1)]
    assert (retried, left) == ({job_id: "pdf" for job_id in failed}, [])
    assert notes == [("fairsched_jobs", "pdf")]
    for job_id in failed:
        job = queue.get_job(job_id)
        assert (job["status"], job["attempts"], job["max_attempts"], job["last_error"]) == (
            "pending", 0, 5, None)
    assert queue.get_job(other_type)["status"] == "failed"
    assert queue.get_job(cancelled)["status"] == "cancelled"
    assert queue.retry_jobs("failed") == ({other_type: "ocr"}, [])
    assert queue.retry_jobs("failed") == ({}, [])
    for bad in ("pending", "done"):
        with pytest.raises(ValueError, match="status must be one of failed, cancelled"):
            queue.retry_jobs(bad)


def test_retry_jobs_leaves_a_job_whose_key_an_unfinished_job_holds(queue):
    # Two unfinished jobs cannot share a key: of the failed ones that share it the newest
    # goes back, and none where a pending job holds it already.
    older, newer = queue.enqueue("mail", key="a"), None
    set_status(queue, older, "failed")
    newer = queue.enqueue("mail", key="a")
    set_status(queue, newer, "failed")
    blocked = queue.enqueue("mail", key="b")
    set_status(queue, blocked, "failed")
    holder = queue.enqueue("mail", key="b")
    plain = queue.enqueue("mail")
    set_status(queue, plain, "failed")
    retried, left = queue.retry_jobs("failed", "mail")
    assert retried == {newer: "mail", plain: "mail"}
    assert left == [older, blocked]
    assert [queue.get_job(j)["status"] for j in (older, newer, blocked, holder, plain)] == [
        "failed", "pending", "failed", "pending", "pending"]


def test_cancel_a_pending_job_at_once(queue):
    job_id = queue.enqueue("pdf")
    assert queue.cancel_job(job_id) == "cancelled"
    job = queue.get_job(job_id)
    assert job["status"] == "cancelled" and job["finished_at"] is not None
    assert not job["cancel_requested"]


def test_cancel_a_running_job_asks_its_supervisor(queue):
    job_id = queue.enqueue("pdf")
    set_status(queue, job_id, "running", attempts=1)
    with psycopg.connect(queue.conn.info.dsn, autocommit=True) as listener:
        listener.execute("LISTEN fairsched_cancel")
        assert queue.cancel_job(job_id) == "running"
        notes = [(n.channel, n.payload) for n in listener.notifies(timeout=5, stop_after=1)]
    assert notes == [("fairsched_cancel", str(job_id))]
    job = queue.get_job(job_id)
    assert job["status"] == "running" and job["cancel_requested"]


def test_cancel_jobs_cancels_every_pending_job_of_a_type_and_asks_for_running_ones(queue):
    pending = [queue.enqueue("pdf") for _ in range(2)]
    other_type = queue.enqueue("ocr")
    running = [queue.enqueue("pdf") for _ in range(2)]
    for job_id in running:
        set_status(queue, job_id, "running", attempts=1)
    assert queue.cancel_jobs("pending", "pdf") == pending
    assert [queue.get_job(j)["status"] for j in pending + [other_type]] == [
        "cancelled", "cancelled", "pending"]
    with psycopg.connect(queue.conn.info.dsn, autocommit=True) as listener:
        listener.execute("LISTEN fairsched_cancel")
        assert queue.cancel_jobs("running") == running
        notes = [(n.channel, n.payload) for n in listener.notifies(timeout=5, stop_after=2)]
    assert sorted(notes) == [("fairsched_cancel", str(j)) for j in running]
    assert all(queue.get_job(j)["cancel_requested"] for j in running)
    assert queue.cancel_jobs("running") == []  # asked already
    with pytest.raises(ValueError, match="status must be one of pending, running"):
        queue.cancel_jobs("failed")


def test_prune_deletes_old_finished_jobs_a_batch_at_a_time(queue):
    def finished(status: str, days_ago: float, type_name: str = "pdf") -> int:
        job_id = queue.enqueue(type_name)
        queue.conn.execute("UPDATE fairsched_jobs SET status = %s, finished_at = now() -"
                           " make_interval(days => %s) WHERE id = %s", (status, days_ago, job_id))
        return job_id

    old = [finished("succeeded", 40) for _ in range(5)]
    old_cancelled = finished("cancelled", 40)
    old_failed = finished("failed", 40)
    old_ocr = finished("succeeded", 40, "ocr")
    recent = finished("succeeded", 10)
    pending = queue.enqueue("pdf")
    month = 30 * 86400
    assert queue.prune_jobs(month, ["succeeded"], "pdf", dry_run=True) == 5
    assert queue.prune_jobs(month, ["succeeded", "cancelled"], "pdf", batch=2) == 6
    assert [queue.get_job(j) for j in old + [old_cancelled]] == [None] * 6
    assert queue.prune_jobs(month) == 1  # succeeded and cancelled of every type: the ocr one
    assert queue.get_job(old_ocr) is None
    kept = (old_failed, recent, pending)
    assert all(queue.get_job(j) is not None for j in kept)
    assert queue.prune_jobs(month, ["failed"]) == 1
    assert queue.prune_jobs(0, ["succeeded"]) == 1  # the recent one
    assert queue.get_job(pending)["status"] == "pending"
    for bad in (["pending"], [], ["running", "failed"]):
        with pytest.raises(ValueError, match="statuses must be some of succeeded, failed"):
            queue.prune_jobs(month, bad)
    with pytest.raises(ValueError, match="older_than must be a number of seconds >= 0"):
        queue.prune_jobs(-1)


def test_cancel_refuses_finished_and_unknown_jobs(queue):
    job_id = queue.enqueue("pdf")
    set_status(queue, job_id, "succeeded")
    with pytest.raises(JobStateError, match=f"job {job_id} already succeeded"):
        queue.cancel_job(job_id)
    with pytest.raises(JobNotFound, match="no job with id 12345"):
        queue.cancel_job(12345)
    with pytest.raises(ValueError, match="job id must be a positive integer"):
        queue.cancel_job("7")


def test_enqueue_joins_the_callers_transaction(db, queue):
    with psycopg.connect(db) as conn:  # not autocommit: the application's transaction
        own = Queue(conn)
        job_id = own.enqueue("pdf")
        assert queue.get_job(job_id) is None
        conn.rollback()
        assert queue.get_job(job_id) is None
        job_id = own.enqueue("pdf")
        conn.commit()
        assert queue.get_job(job_id)["status"] == "pending"


def test_queue_open_owns_its_connection(db, tmp_path, monkeypatch):
    monkeypatch.delenv("FAIRSCHED_DATABASE_URL", raising=False)
    with Queue.open(tmp_path, db) as queue:
        job_id = queue.enqueue("pdf")
        conn = queue.conn
    assert conn.closed
    with Queue.open(tmp_path, db) as queue:
        assert queue.get_job(job_id)["type"] == "pdf"


def test_queue_open_takes_a_workers_toml_and_refuses_a_state_dir_that_is_not_there(
        db, tmp_path, monkeypatch):
    monkeypatch.delenv("FAIRSCHED_DATABASE_URL", raising=False)
    config = tmp_path / "workers.toml"
    config.write_text(f'[supervisor]\nstate_dir = "state"\ndatabase = "{db}"\n\n'
                      '[[worker]]\nname = "pdf"\ntypes = ["pdf"]\ncommand = ["true"]\n')
    with Queue.open(config) as queue:  # its database setting, not an embedded server
        job_id = queue.enqueue("pdf")
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT type FROM fairsched_jobs WHERE id = %s",
                            (job_id,)).fetchone() == ("pdf",)
    for wrong in (tmp_path / "typo", tmp_path):  # not there; the config's folder, not its state
        with pytest.raises(DatabaseUnavailable, match=": no embedded database here; give the"):
            Queue.open(wrong)
    assert not (tmp_path / "typo").exists() and not (tmp_path / "pg").exists()


def test_a_job_enqueued_late_in_a_long_transaction_keeps_its_whole_delay(db):
    with psycopg.connect(db) as conn:  # one transaction, 1.5 s old when the jobs go in
        conn.execute("SELECT 1")
        time.sleep(1.5)
        (job,) = Queue(conn).enqueue_many([{"type": "pdf", "delay": 2}])
        conn.commit()
        age, wait = conn.execute(
            "SELECT extract(epoch FROM clock_timestamp() - created_at),"
            " extract(epoch FROM run_after - clock_timestamp()) FROM fairsched_jobs"
            " WHERE id = %s", (job,)).fetchone()
    assert float(age) < 1.0
    assert float(wait) > 1.0
