"""job.transaction(): a handler's writes and its job's success in one transaction, fenced by
the job's claim. Real workers driven through their socketpair, on the test database."""

from __future__ import annotations

import os
import random
import threading

import psutil
import psycopg
import pytest
from handlers.worker_peer import Peer, make_spec

from fairsched.protocol import encode_run
from fairsched.store.queue import Queue
from fairsched.worker.launch import launch
from tests.supervisor_harness import wait_until


@pytest.fixture
def rows_db(db):
    """The clean database with an empty tx_rows, the table the transactional handlers write."""
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS tx_rows")
        conn.execute("CREATE TABLE tx_rows (job_id text NOT NULL, attempt integer NOT NULL)")
    return db


@pytest.fixture
def worker(rows_db, tmp_path):
    """A cold-launched worker running worker_handlers:transactional for type "tx", given the
    queue's database as the supervisor gives it."""
    peers = []

    def start() -> Peer:
        spec = make_spec(tmp_path, handler="worker_handlers:transactional", types=("tx",))
        spec.database_url = rows_db
        peer = Peer(launch(spec, "inc-1"), "inc-1", spec)
        peers.append(peer)
        peer.hello()
        return peer

    yield start
    for peer in peers:
        peer.cleanup()


def claimed(url: str, payload=None) -> tuple[int, int]:
    """A job enqueued and marked running as a supervisor's claim leaves it: (id, claim)."""
    with psycopg.connect(url, autocommit=True) as conn:
        job_id = Queue(conn).enqueue("tx", payload)
        claim = conn.execute("UPDATE fairsched_jobs SET status = 'running', claims = claims + 1,"
                             " attempts = attempts + 1, started_at = now() WHERE id = %s"
                             " RETURNING claims", (job_id,)).fetchone()[0]
    return job_id, claim


def run(peer: Peer, job_id, claim: int, payload_json: str = "null", on_demand=False) -> None:
    peer.sock.sendall(encode_run("inc-1", 0, job_id, "tx", 0, 1, on_demand, payload_json, claim))


def state(url: str, job_id: int):
    with psycopg.connect(url) as conn:
        status, result = conn.execute("SELECT status, result FROM fairsched_jobs WHERE id = %s",
                                      (job_id,)).fetchone()
        rows = conn.execute("SELECT job_id FROM tx_rows ORDER BY job_id").fetchall()
    return status, result, [r[0] for r in rows]


def test_the_commit_marks_the_job_succeeded_with_the_handlers_rows(worker, rows_db):
    peer = worker()
    job_id, claim = claimed(rows_db)
    run(peer, job_id, claim)
    assert peer.expect("result") == {"t": "result", "slot": 0, "job_id": job_id,
                                     "result": None, "recorded": True}
    assert state(rows_db, job_id) == ("succeeded", None, [str(job_id)])
    # The slot's connection is kept for its next job: one session of the worker's, not two.
    second, claim2 = claimed(rows_db)
    run(peer, second, claim2)
    assert peer.expect("result")["recorded"] is True
    with psycopg.connect(rows_db) as conn:
        sessions = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid <> "
                                "pg_backend_pid() AND datname = current_database() AND "
                                "backend_type = 'client backend'").fetchone()[0]
    assert sessions == 1
    assert state(rows_db, second)[0] == "succeeded"


def test_an_exception_inside_the_block_leaves_nothing(worker, rows_db):
    peer = worker()
    job_id, claim = claimed(rows_db)
    run(peer, job_id, claim, '{"fail": true}')
    msg = peer.expect("error")
    assert msg["error"] == "RuntimeError: failed inside the block" and not msg["permanent"]
    assert state(rows_db, job_id) == ("running", None, [])  # its supervisor writes the failure


def test_a_lost_claim_cannot_commit(worker, rows_db, tmp_path):
    peer = worker()
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    job_id, claim = claimed(rows_db, {"wait": str(fifo)})
    run(peer, job_id, claim, f'{{"wait": "{fifo}"}}')
    assert peer.expect("progress")["message"] == "inside"  # its insert is made, not committed
    with psycopg.connect(rows_db, autocommit=True) as conn:  # rescued and claimed elsewhere
        conn.execute("UPDATE fairsched_jobs SET claims = claims + 1 WHERE id = %s", (job_id,))
    with open(fifo, "w") as go:
        go.write("go\n")
    msg = peer.expect("error")
    assert msg["error"].startswith(f"ClaimLost: job {job_id} is no longer this run's")
    assert state(rows_db, job_id) == ("running", None, [])


def test_a_raise_after_the_commit_leaves_the_job_succeeded(worker, rows_db):
    peer = worker()
    job_id, claim = claimed(rows_db, {"raise_after": True})
    run(peer, job_id, claim, '{"raise_after": true}')
    assert peer.expect("result")["recorded"] is True
    assert state(rows_db, job_id) == ("succeeded", None, [str(job_id)])
    log = peer.spec.log_path.read_text()
    assert (f"job {job_id} (tx) raised RuntimeError: raised after the commit after its "
            "transaction committed; the job stays succeeded") in log


def test_an_on_demand_jobs_transaction_is_a_plain_one(worker, rows_db):
    peer = worker()
    run(peer, "od-1", 0, on_demand=True)
    assert peer.expect("result") == {"t": "result", "slot": 0, "job_id": "od-1",
                                     "result": "returned"}
    assert state_rows(rows_db) == ["od-1"]


def test_a_process_the_handler_forked_has_no_transaction(rows_db, tmp_path):
    spec = make_spec(tmp_path, handler="worker_handlers:transaction_in_a_fork", types=("tx",))
    spec.database_url = rows_db
    peer = Peer(launch(spec, "inc-1"), "inc-1", spec)
    try:
        peer.hello()
        job_id, claim = claimed(rows_db)
        run(peer, job_id, claim)
        assert peer.expect("result")["result"] == (
            "RuntimeError: job.transaction() works in the worker, not in a process its handler "
            "forked")
        assert state(rows_db, job_id) == ("running", None, [])
    finally:
        peer.cleanup()


def state_rows(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT job_id FROM tx_rows").fetchall()]


# -- with real supervisors ------------------------------------------------------------------------

ROWS = """
[[worker]]
name = "rows"
types = ["rows"]
handler = "sup_handlers:{handler}"
processes = 2
slots = 2
max_attempts = 1000
max_restarts = 1000
restart_window = 0.5
retry_backoff = 0
"""


def test_a_supervisors_job_commits_once_after_a_rolled_back_attempt(supervisors, rows_db,
                                                                    tmp_path):
    sup = supervisors(ROWS.replace("{handler}", "tx_row")).start()
    with psycopg.connect(rows_db, autocommit=True) as conn:
        job_id = Queue(conn).enqueue("rows", {"pids": str(tmp_path / "pids"), "fail_first": True})
    wait_until(lambda: finished(rows_db) == 1, 30, "the job finished")
    with psycopg.connect(rows_db) as conn:
        row = conn.execute("SELECT status, attempts, result, last_error FROM fairsched_jobs"
                           " WHERE id = %s", (job_id,)).fetchone()
        rows = conn.execute("SELECT attempt FROM tx_rows").fetchall()
    assert row == ("succeeded", 2, None, "RuntimeError: first attempt fails inside the block")
    assert rows == [(2,)]  # the first attempt's row went with its rollback
    sup.wait_output(rf"job {job_id} succeeded: .* \(recorded in its transaction\)")


def test_a_job_that_committed_and_then_timed_out_stays_succeeded(supervisors, rows_db,
                                                                  tmp_path):
    sup = supervisors(ROWS.replace("{handler}", "tx_row") + "timeout = 1\n").start()
    with psycopg.connect(rows_db, autocommit=True) as conn:
        job_id = Queue(conn).enqueue("rows", {"pids": str(tmp_path / "pids"), "after": 60})
    sup.wait_output(rf"job {job_id} on worker rows-\d timed out after 1 s")
    sup.wait_output(r"the outcome of 1 job was not recorded: .*: " + str(job_id))
    with psycopg.connect(rows_db) as conn:
        row = conn.execute("SELECT status, attempts FROM fairsched_jobs WHERE id = %s",
                           (job_id,)).fetchone()
        rows = conn.execute("SELECT job_id FROM tx_rows").fetchall()
    assert row == ("succeeded", 1)
    assert rows == [(str(job_id),)]


def finished(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM fairsched_jobs WHERE status IN"
                            " ('succeeded', 'failed', 'cancelled')").fetchone()[0]


def drill(supervisors, url: str, folder, handler: str, jobs: int):
    """`jobs` jobs of `handler` on two supervisors while a worker is killed (SIGKILL) every
    200 ms and one supervisor is killed twice (at a fifth and at half of the jobs done), and
    started again. Returns (statuses, rows per job id, worker kills)."""
    pids = folder / "pids"
    pids.touch()
    workers = ROWS.replace("{handler}", handler)
    sups = [supervisors(workers, supervisor="lease = 2\n").start() for _ in range(2)]
    with psycopg.connect(url, autocommit=True) as conn:
        Queue(conn).enqueue_many([{"type": "rows", "payload": {"pids": str(pids),
                                                                "seconds": 0.02}}] * jobs)
    stop = threading.Event()
    kills = []
    rng = random.Random(7)

    def killer():
        while not stop.wait(0.2):
            parents = {s.proc.pid for s in sups if s.proc.poll() is None}
            alive = []
            for line in pids.read_text().split():
                try:
                    if psutil.Process(int(line)).ppid() in parents:
                        alive.append(int(line))
                except psutil.NoSuchProcess:
                    pass
            if alive:
                victim = rng.choice(alive)
                os.kill(victim, 9)
                kills.append(victim)

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        for share in (5, 2):
            wait_until(lambda share=share: finished(url) >= jobs // share, 60,
                       f"1/{share} of the jobs finished")
            sups[0].proc.kill()
            sups[0].proc.wait()
            sups[0].start(wait=False)
        wait_until(lambda: finished(url) >= jobs, 120, "every job finished")
    finally:
        stop.set()
        thread.join()
    with psycopg.connect(url) as conn:
        statuses = dict(conn.execute("SELECT status, count(*) FROM fairsched_jobs"
                                     " GROUP BY status").fetchall())
        rows = dict(conn.execute("SELECT j.id, count(r.job_id) FROM fairsched_jobs j LEFT JOIN"
                                 " tx_rows r ON r.job_id = j.id::text GROUP BY j.id").fetchall())
    return statuses, rows, kills


def test_transactional_rows_are_written_exactly_once_under_kills(supervisors, rows_db, tmp_path):
    statuses, rows, kills = drill(supervisors, rows_db, tmp_path, "tx_row", 1000)
    assert statuses == {"succeeded": 1000}
    assert len(kills) >= 10
    assert set(rows.values()) == {1}, sorted(n for n in rows.values() if n != 1)


def test_without_transaction_the_same_kills_write_rows_twice(supervisors, rows_db, tmp_path):
    statuses, rows, kills = drill(supervisors, rows_db, tmp_path, "plain_row", 1000)
    assert statuses == {"succeeded": 1000}
    assert min(rows.values()) == 1  # every job wrote its row...
    assert max(rows.values()) >= 2  # ...and some of them again, on a run after a kill
