"""Idempotency keys in the Queue API: the same job under a held key gives the holder's id,
another job raises KeyConflict and queues nothing of the call, in the table or in the call."""

from __future__ import annotations

import threading

import psycopg
import pytest

import fairsched
from fairsched.store.queue import Queue
from tests.conftest import jobs_in
from tests.supervisor_harness import wait_until


def test_the_same_job_under_a_held_key_gives_its_id(queue, db):
    first = queue.enqueue("mail", {"to": "a", "n": 1e23}, priority=3, key="invoice-17")
    # Payloads compare as jsonb stores them: key order and how a number is written aside.
    assert queue.enqueue("mail", {"n": 100000000000000000000000, "to": "a"}, priority=3,
                         key="invoice-17") == first
    # max_attempts and delay are not what makes a job the same one.
    assert queue.enqueue("mail", {"to": "a", "n": 1e23}, priority=3, max_attempts=9, delay=60,
                         key="invoice-17") == first
    assert jobs_in(db) == 1


@pytest.mark.parametrize("other", [
    {"type": "sms", "payload": {"to": "a"}},
    {"type": "mail", "payload": {"to": "b"}},
    {"type": "mail", "payload": None},
    {"type": "mail", "payload": {"to": "a"}, "priority": 1},
    {"type": "mail", "payload": {"to": True}},  # jsonb: true is not 1, as it is in Python
], ids=["type", "payload", "no payload", "priority", "true is not 1"])
def test_another_job_under_a_held_key_is_a_key_conflict(queue, db, other):
    held = queue.enqueue("mail", {"to": 1 if other["payload"] == {"to": True} else "a"},
                         key="invoice-17")
    with pytest.raises(fairsched.KeyConflict) as err:
        queue.enqueue(**other, key="invoice-17")
    assert isinstance(err.value, fairsched.FairschedError)
    assert (err.value.key, err.value.job_id, err.value.index) == ("invoice-17", held, 0)
    assert str(err.value).startswith(f"key 'invoice-17' is held by job {held} (type mail, "
                                     "priority 0, payload {\"to\": ")
    assert str(err.value).endswith("), not this job; nothing was queued")
    assert jobs_in(db) == 1


def test_enqueue_many_with_two_jobs_under_one_key_queues_nothing(queue, db):
    # It returned [23, 23]: the second job was dropped without a word.
    with pytest.raises(fairsched.KeyConflict) as err:
        queue.enqueue_many([{"type": "pdf"},
                            {"type": "mail", "payload": {"to": "a"}, "key": "k"},
                            {"type": "mail", "payload": {"to": "b"}, "key": "k"}])
    assert (err.value.key, err.value.job_id, err.value.index) == ("k", None, 2)
    assert str(err.value) == ("job 2: key 'k' is held by job 1 of this call (type mail, "
                              "priority 0, payload {\"to\": \"a\"}), not this job; nothing "
                              "was queued")
    assert jobs_in(db) == 0
    # The same job twice under one key is one job.
    ids = queue.enqueue_many([{"type": "mail", "payload": {"to": "a"}, "key": "k"},
                              {"type": "pdf"},
                              {"type": "mail", "payload": {"to": "a"}, "key": "k"}])
    assert ids[0] == ids[2] != ids[1]
    assert jobs_in(db) == 2


def test_enqueue_many_with_one_job_against_a_held_key_queues_nothing(queue, db):
    held = queue.enqueue("mail", {"to": "a"}, key="k")
    with pytest.raises(fairsched.KeyConflict) as err:
        queue.enqueue_many([{"type": "pdf"}, {"type": "mail", "key": "other"},
                            {"type": "mail", "payload": {"to": "b"}, "key": "k"}])
    assert (err.value.job_id, err.value.index) == (held, 2)
    assert str(err.value).startswith(f"job 2: key 'k' is held by job {held} (type mail")
    assert jobs_in(db) == 1


def test_a_key_conflict_inside_the_callers_transaction_leaves_the_rest_of_it(db):
    with psycopg.connect(db) as conn:  # not autocommit: the application's transaction
        queue = Queue(conn)
        kept = queue.enqueue("mail", {"to": "a"}, key="k")
        with pytest.raises(fairsched.KeyConflict):
            queue.enqueue_many([{"type": "pdf"}, {"type": "mail", "key": "k"}])
        # The transaction goes on, with what it held before the call.
        assert queue.enqueue("pdf") > kept
        conn.commit()
    assert jobs_in(db) == 2


def test_a_key_conflict_as_a_transactions_first_statement_leaves_none_open(db):
    with psycopg.connect(db, autocommit=True) as other:
        held = Queue(other).enqueue("mail", key="k")
    with psycopg.connect(db) as conn:
        queue = Queue(conn)
        with pytest.raises(fairsched.KeyConflict):
            queue.enqueue_many([{"type": "pdf"}, {"type": "mail", "payload": 1, "key": "k"}])
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        # Still the caller's to commit otherwise: a job exists once it does.
        job_id = queue.enqueue("pdf")
        assert jobs_in(db) == 1
        conn.commit()
    assert jobs_in(db) == 2 and job_id != held


def test_a_key_taken_while_the_call_waits_on_it_still_queues_nothing(db):
    # The holder commits while the call's statement waits on its insert: that statement's
    # snapshot does not show it, the key comes back unresolved, and the call looks again.
    # By then the job without a key was written; it must not stay.
    holder = psycopg.connect(db)
    try:
        held = Queue(holder).enqueue("mail", {"to": "a"}, key="k")  # not committed yet
        errors: list[BaseException] = []
        pid: list[int] = []

        def enqueue() -> None:
            try:
                with psycopg.connect(db, autocommit=True) as conn:
                    pid.append(conn.info.backend_pid)
                    Queue(conn).enqueue_many([{"type": "pdf"},
                                              {"type": "mail", "payload": {"to": "b"},
                                               "key": "k"}])
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=enqueue)
        thread.start()
        with psycopg.connect(db, autocommit=True) as watcher:
            def waiting() -> bool:
                return bool(pid) and watcher.execute(
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                    (pid[0],)).fetchone()[0]

            wait_until(waiting, what="the enqueue waiting on the uncommitted key")
        holder.commit()
        thread.join(30)
        assert not thread.is_alive()
    finally:
        holder.close()
    assert len(errors) == 1 and isinstance(errors[0], fairsched.KeyConflict), errors
    assert errors[0].job_id == held
    assert jobs_in(db) == 1
