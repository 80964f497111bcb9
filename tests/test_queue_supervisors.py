"""The durable queue as users run it: real supervisors (subprocesses) sharing one PostgreSQL."""

import collections
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import psycopg
import pytest

from fairsched.store.errors import JobStateError
from fairsched.store.queue import Queue
from tests.conftest import embedded_cluster
from tests.supervisor_harness import Supervisor, alive, wait_until

RECORD = """
[[worker]]
name = "rec"
types = ["rec"]
handler = "sup_handlers:record"
processes = {processes}
slots = {slots}
retry_backoff = 0.05
"""


SLOW = """
[[worker]]
name = "slow"
types = ["slow"]
handler = "sup_handlers:slow"
"""  # one process, one slot; settings may follow


def enqueue(url, jobs):
    with psycopg.connect(url, autocommit=True) as conn:
        return Queue(conn).enqueue_many(jobs)


def job_rows(url, ids=None):
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, status, attempts, started_at, created_at, last_error"
                            " FROM fairsched_jobs ORDER BY id").fetchall()
    return [r for r in rows if ids is None or r[0] in ids]


def wait_all_finished(url, count, timeout=120, sups=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with psycopg.connect(url) as conn:
            (done,) = conn.execute("SELECT count(*) FROM fairsched_jobs WHERE status IN"
                                   " ('succeeded', 'failed', 'cancelled')").fetchone()
        if done >= count:
            return
        for sup in sups:
            assert sup.proc.poll() is None, sup.output()[-3000:]
        time.sleep(0.1)
    raise AssertionError(f"only {done} of {count} jobs finished; "
                         + "".join(s.output()[-2000:] for s in sups))


def recorded(log: Path) -> collections.Counter:
    if not log.exists():
        return collections.Counter()
    return collections.Counter(int(line.split()[0]) for line in log.read_text().splitlines())


def test_three_supervisors_run_every_job_exactly_once(supervisors, db, tmp_path):
    log = tmp_path / "runs.log"
    sups = [supervisors(RECORD.format(processes=1, slots=4)).start() for _ in range(3)]
    ids = enqueue(db, [{"type": "rec", "payload": {"log": str(log)}} for _ in range(3000)])
    wait_all_finished(db, 3000, sups=sups)
    counts = recorded(log)
    assert set(counts) == set(ids)
    assert all(n == 1 for n in counts.values()), [i for i, n in counts.items() if n > 1][:10]
    rows = job_rows(db)
    assert {r[1] for r in rows} == {"succeeded"}
    pids_per_sup = collections.Counter()
    for line in log.read_text().splitlines():
        pids_per_sup[line.split()[2]] += 1
    assert len(pids_per_sup) == 3  # every supervisor's worker took part


def test_low_priority_job_is_not_starved_by_a_stream(supervisors, db, tmp_path):
    # W_p / W_a = 0.2 s per priority step: a priority-0 job overtakes fresh priority-10 jobs after 2 s.
    supervisors(RECORD.format(processes=1, slots=1),
                scoring="age_weight = 5120\n").start()
    log = tmp_path / "runs.log"
    job = {"type": "rec", "payload": {"log": str(log), "seconds": 0.05}, "priority": 10}
    enqueue(db, [job] * 5)
    (low,) = enqueue(db, [dict(job, priority=0)])
    stop = threading.Event()

    def stream():  # 30 priority-10 jobs a second against a capacity of about 20
        while not stop.is_set():
            enqueue(db, [job])
            time.sleep(1 / 30)

    feeder = threading.Thread(target=stream)
    feeder.start()
    try:
        deadline = time.monotonic() + 60  # about 3.3 s on a quiet machine (below)
        while time.monotonic() < deadline:
            (row,) = job_rows(db, {low})
            if row[3] is not None:
                break
            time.sleep(0.05)
    finally:
        stop.set()
        feeder.join()
    (row,) = job_rows(db, {low})
    assert row[3] is not None, "the priority-0 job never started"
    # 5 queued ahead + the 2 s of stream it must let pass (60 jobs) at ~20 jobs/s: about 3.3 s
    # on a quiet machine. However slow the machine, the bound holds in jobs: nothing created
    # more than 2 s after it started before it.
    with psycopg.connect(db) as conn:
        (latest_ahead,) = conn.execute(
            "SELECT extract(epoch FROM max(created_at) - %s)::float8 FROM fairsched_jobs"
            " WHERE priority = 10 AND started_at < %s", (row[4], row[3])).fetchone()
        (overtaken,) = conn.execute(
            "SELECT count(*) FROM fairsched_jobs WHERE priority = 10 AND created_at < %s"
            " AND (started_at IS NULL OR started_at > %s)", (row[3], row[3])).fetchone()
    assert latest_ahead < 2.25, f"a job created {latest_ahead:.2f} s after it started first"
    assert overtaken > 0  # it started while higher-priority work was still waiting


def started_at(url, ids) -> dict[int, float]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, extract(epoch FROM started_at)::float8 FROM fairsched_jobs"
                            " WHERE id = ANY(%s)", (list(ids),)).fetchall()
    return dict(rows)


def test_a_job_queued_while_its_type_was_busy_is_weighed_against_the_fetched_ones(
        supervisors, db):
    # The supervisor fetched the running job and the priority-0 one behind it while its
    # slot was free; the priority-10 job comes while it is busy. When the slot frees, the
    # best pending job runs, not the best one it happened to know of.
    supervisors(SLOW).start()
    running, low = enqueue(db, [{"type": "slow", "payload": {"seconds": 2}},
                                {"type": "slow", "payload": {"seconds": 0}}])
    wait_until(lambda: started_at(db, [running])[running] is not None, what="the first job")
    time.sleep(0.3)
    (high,) = enqueue(db, [{"type": "slow", "payload": {"seconds": 0}, "priority": 10}])
    wait_all_finished(db, 3)
    starts = started_at(db, [low, high])
    assert starts[high] < starts[low], starts


def test_a_delayed_job_that_comes_due_is_weighed_against_the_fetched_ones(supervisors, db):
    # The first fetch, full, found the delayed priority-5 job not yet due; when it comes due
    # the supervisor learns of it (a timer set from the table), ahead of the priority-0 jobs
    # it had fetched.
    supervisors(SLOW + "slots = 2\n").start()
    ids = enqueue(db, [{"type": "slow", "payload": {"seconds": 0.5}, "priority": 5, "delay": 0.3}]
                  + [{"type": "slow", "payload": {"seconds": 0.5}}] * 8)
    wait_all_finished(db, 9, timeout=60)
    starts = started_at(db, ids)
    with psycopg.connect(db) as conn:
        (due,) = conn.execute("SELECT extract(epoch FROM run_after)::float8 FROM fairsched_jobs"
                              " WHERE id = %s", (ids[0],)).fetchone()
    passed_over = [i for i in ids[1:] if due + 0.05 < starts[i] < starts[ids[0]]]
    assert passed_over == [], (due, starts)


def test_an_on_demand_request_waits_behind_a_queued_job_past_their_crossover(supervisors, db):
    # B_od / W_a = 1 s: a queued priority-0 job that has waited longer than that outranks a
    # fresh on-demand request, though the supervisor had not fetched it when the slot freed.
    sup = supervisors(SLOW, scoring="on_demand_bonus = 16\non_demand_age_weight = 0\n").start()
    (blocker,) = enqueue(db, [{"type": "slow", "payload": {"seconds": 3}}])
    wait_until(lambda: started_at(db, [blocker])[blocker] is not None, what="the first job")
    (queued,) = enqueue(db, [{"type": "slow", "payload": {"seconds": 1}}])
    time.sleep(2)  # the queued job waits past the crossover before the slot frees
    result = sup.cli("submit", "slow", "--on-demand", "--payload", '{"seconds": 0}')
    answered = time.time()
    assert result.returncode == 0, result.stderr
    queued_start = started_at(db, [queued])[queued]
    # Queued first: the request ran after its second; ahead of it, it would be answered first.
    assert queued_start is not None and queued_start < answered - 0.8, (queued_start, answered)


def test_killed_supervisor_jobs_are_finished_by_another(supervisors, db, tmp_path):
    log = tmp_path / "runs.log"
    workers = RECORD.format(processes=1, slots=2)
    first = supervisors(workers, supervisor="lease = 2\nheartbeat_interval = 0.5\n").start()
    ids = enqueue(db, [{"type": "rec", "payload": {"log": str(log), "seconds": 3}}
                       for _ in range(4)])
    # A slot reserved for a claim shows busy before its job runs there: wait for the jobs.
    first.wait_for(lambda ps: sum(s["job_id"] is not None for s in ps["slots"]) == 2,
                   what="2 running")
    first.proc.kill()
    first.proc.wait()
    began = time.monotonic()
    second = supervisors(workers, supervisor="lease = 2\nheartbeat_interval = 0.5\n").start()
    wait_all_finished(db, 4, timeout=60, sups=[second])
    rows = job_rows(db, set(ids))
    assert {r[1] for r in rows} == {"succeeded"}
    assert sorted(r[2] for r in rows) == [1, 1, 2, 2]  # the two killed runs cost an attempt
    assert time.monotonic() - began < 30


def test_a_rescue_says_which_jobs_it_returned_and_which_it_cancelled(supervisors, db, tmp_path):
    workers = RECORD.format(processes=1, slots=2)
    settings = "lease = 2\nheartbeat_interval = 0.5\n"
    first = supervisors(workers, supervisor=settings).start()
    enqueue(db, [{"type": "rec", "payload": {"log": str(tmp_path / "runs.log"), "seconds": 3}}
                 for _ in range(2)])
    # A slot reserved for a claim shows busy before its job runs there: wait for the jobs.
    ps = first.wait_for(lambda ps: sum(s["job_id"] is not None for s in ps["slots"]) == 2,
                        what="2 running")
    running = sorted(s["job_id"] for s in ps["slots"])
    first.proc.kill()
    first.proc.wait()
    # Cancelled while its supervisor is dead: the rescue ends it, and does not queue it again.
    assert first.cli("cancel", str(running[0])).returncode == 0
    second = supervisors(workers, supervisor=settings).start()
    wait_all_finished(db, 2, timeout=60, sups=[second])
    assert {row[0]: row[1] for row in job_rows(db, set(running))} == {
        running[0]: "cancelled", running[1]: "succeeded"}
    assert ("took back 2 running jobs of dead supervisors: 1 returned to the queue, "
            "1 cancelled, as asked") in second.output(), second.output()


def test_a_jump_of_the_database_clock_makes_no_live_supervisor_look_dead(
        supervisors, db, tmp_path):
    # Every heartbeat in the table suddenly an hour old: what a server clock that jumped
    # an hour ahead shows. The heartbeats go on; no one may take their jobs for dead.
    log = tmp_path / "runs.log"
    workers = RECORD.format(processes=1, slots=1)
    settings = "lease = 2\nheartbeat_interval = 0.5\n"
    first = supervisors(workers, supervisor=settings).start()
    (job,) = enqueue(db, [{"type": "rec", "payload": {"log": str(log), "seconds": 5}}])
    first.wait_for(lambda ps: ps["slots"][0]["job_id"] == job, what="the job running")
    second = supervisors(workers, supervisor=settings).start()
    time.sleep(2.5)  # the second one has been in touch for a whole lease
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("UPDATE fairsched_supervisors SET heartbeat_at = now() - interval '1 hour'")
    wait_all_finished(db, 1, timeout=30, sups=[first, second])
    (row,) = job_rows(db, {job})
    assert row[1:3] == ("succeeded", 1), row
    assert "dead supervisors" not in second.output() + first.output()
    assert recorded(log)[job] == 1


def test_a_killed_supervisors_workers_go_with_it_and_what_their_jobs_started(
        supervisors, db, tmp_path):
    # A command worker deep in a job never reads its pipe, so it cannot see its supervisor
    # go; the lease watchdog takes it down, and its job's helper with it.
    script = Path(__file__).parent / "handlers" / "garbage_worker.py"
    sup = supervisors(f"""
[[worker]]
name = "deaf"
types = ["deaf"]
command = ["{sys.executable}", "{script}", "deaf"]
""").start()
    pids = tmp_path / "pids"
    enqueue(db, [{"type": "deaf", "payload": {"pids": str(pids)}}])
    deadline = time.monotonic() + 20
    while not (pids.exists() and pids.read_text()):
        assert time.monotonic() < deadline, sup.output()
        time.sleep(0.05)
    worker, child = map(int, pids.read_text().split())
    sup.proc.kill()
    sup.proc.wait()
    deadline = time.monotonic() + 10
    while alive(worker) or alive(child):
        assert time.monotonic() < deadline, "a worker or its job's helper outlived its supervisor"
        time.sleep(0.05)


def test_postgres_restart_mid_run_loses_nothing_runs_nothing_twice(supervisors, tmp_path,
                                                                   short_tmp):
    from fairsched.store.database import open_database

    pgdata = short_tmp / "pg"
    server = embedded_cluster(pgdata)
    url = server.url()
    try:
        open_database(tmp_path, url).close()  # migrations
        log = tmp_path / "runs.log"
        sup = Supervisor(url, RECORD.format(processes=2, slots=2),
                         supervisor="lease = 30\n").start()
        try:
            ids = enqueue(url, [{"type": "rec", "payload": {"log": str(log), "seconds": 0.01}}
                                for _ in range(400)])
            while len(recorded(log)) < 60:
                time.sleep(0.02)
            server.restart("fast")
            wait_all_finished(url, 400, timeout=90, sups=[sup])
            counts = recorded(log)
            assert set(counts) == set(ids)
            assert max(counts.values()) == 1, sup.output()[-6000:]
            assert {r[1] for r in job_rows(url)} == {"succeeded"}
            assert "lost the database" in sup.output()
        finally:
            sup.close()
    finally:
        server.stop()


def test_an_outcome_after_the_database_came_back_is_written_without_a_warning(tmp_path,
                                                                             short_tmp):
    # The job outlives a restart of PostgreSQL; the outcome lane's connection, idle through
    # it, is found dead only when the result comes: replaced quietly, the outage reported
    # (and its end) already.
    from fairsched.store.database import open_database

    pgdata = short_tmp / "pg"
    server = embedded_cluster(pgdata)
    url = server.url()
    try:
        open_database(tmp_path, url).close()  # migrations
        sup = Supervisor(url, SLOW, supervisor="lease = 30\n").start()
        try:
            (job,) = enqueue(url, [{"type": "slow", "payload": {"seconds": 4}}])
            sup.wait_for(lambda ps: ps["slots"][0]["job_id"] == job, what="the job running")
            server.restart("fast")
            sup.wait_output("database connection restored", timeout=30)
            wait_all_finished(url, 1, timeout=30, sups=[sup])
            assert [r[1] for r in job_rows(url)] == ["succeeded"]
            after = sup.output().split("database connection restored", 1)[1]
            assert "could not write" not in after, after
        finally:
            sup.close()
    finally:
        server.stop()


REFUSE_SUCCESS = """
CREATE FUNCTION fs_refuse_success() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'no success today' USING ERRCODE = 'query_canceled'; END $$;
CREATE TRIGGER fs_refuse_success BEFORE UPDATE ON fairsched_jobs FOR EACH ROW
    WHEN (NEW.status = 'succeeded') EXECUTE FUNCTION fs_refuse_success();
"""


def test_outcomes_the_database_does_not_take_are_counted_in_the_log(supervisors, db):
    # Claims go through, successes are refused: the outcome lane says how many outcomes wait,
    # in the singular for one ("could not write 1 job outcomes" it said), and writes them once
    # the database takes them.
    sup = supervisors(SLOW, supervisor="lease = 30\n").start()
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(REFUSE_SUCCESS)
        try:
            (first,) = enqueue(db, [{"type": "slow", "payload": {"seconds": 0}}])
            sup.wait_output(r"could not write 1 job outcome: no success today; trying again")
            (second,) = enqueue(db, [{"type": "slow", "payload": {"seconds": 0}}])
            sup.wait_output(r"could not write 2 job outcomes: no success today; trying again")
        finally:
            conn.execute("DROP FUNCTION fs_refuse_success() CASCADE")
    wait_all_finished(db, 2, timeout=30, sups=[sup])
    assert [r[:2] for r in job_rows(db)] == [(first, "succeeded"), (second, "succeeded")]
    assert "1 job outcomes" not in sup.output()


FAIL_LATER = """
[[worker]]
name = "late"
types = ["late"]
handler = "sup_handlers:fail_later"
max_attempts = 1
"""


def test_a_job_that_fails_on_its_own_during_a_shutdown_spends_its_attempt(supervisors, db):
    # Only a job stopped for the shutdown goes back unspent; one that failed meanwhile (here
    # for good) has failed, and must not run again.
    sup = supervisors(FAIL_LATER).start()
    (job,) = enqueue(db, [{"type": "late", "payload": {"seconds": 1, "permanent": True}}])
    sup.wait_for(lambda ps: ps["slots"][0]["job_id"] == job, what="the job running")
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(30) == 0
    (row,) = job_rows(db, {job})
    assert (row[1], row[2]) == ("failed", 1), row
    assert "this input can never work (found late)" in row[5]


def test_an_on_demand_job_that_fails_on_its_own_through_a_restart_is_not_run_again(
        supervisors, db):
    sup = supervisors(FAIL_LATER).start()
    caller = sup.spawn_cli("submit", "late", "--on-demand", "--payload",
                           '{"seconds": 1, "permanent": true}')
    sup.wait_for(lambda ps: ps["slots"][0]["state"] == "busy", what="the job running")
    assert sup.cli("restart", "late").returncode == 0
    out, err = caller.communicate(timeout=30)
    assert caller.returncode == 1
    assert "this input can never work (found late)" in err, err
    assert "runs again" not in sup.output()


@contextlib.contextmanager
def stopped_while_cut_off(db, settings: str):
    """A supervisor whose job finished while PostgreSQL was out of reach, then stopped
    (SIGTERM) before it is back: yields (supervisor, job id, the proxy that cut it off)."""
    from tests.pg_proxy import PgProxy

    proxy = PgProxy(db)
    sup = Supervisor(proxy.url_through, SLOW, supervisor=settings)
    try:
        sup.start()
        (job,) = enqueue(db, [{"type": "slow", "payload": {"seconds": 1}}])
        sup.wait_for(lambda ps: ps["slots"][0]["job_id"] == job, what="the job running")
        proxy.cut()
        sup.wait_output(f"job {job} succeeded")
        sup.signal(signal.SIGTERM)
        yield sup, job, proxy
    finally:
        sup.close()
        proxy.close()


def test_a_stop_just_after_the_database_went_silent_does_not_hang(db):
    # Nothing noticed the silence yet; saying goodbye to the database must not wait for it.
    from tests.pg_proxy import PgProxy

    proxy = PgProxy(db)
    sup = Supervisor(proxy.url_through, SLOW, supervisor="lease = 8\n")
    try:
        sup.start()
        proxy.cut()
        began = time.monotonic()
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit(30) == 0
        assert time.monotonic() - began < 10
        assert "could not deregister from the database: no answer from PostgreSQL within 2 s" in (
            sup.output()), sup.output()[-2000:]
    finally:
        sup.close()
        proxy.close()


def test_a_row_left_behind_by_a_stop_the_database_did_not_hear_costs_nothing(db):
    # Its outcomes written, the supervisor loses the database as it says goodbye: its row
    # stays until its lease runs out, and neither jobs nor the next supervisor suffer for it.
    from tests.pg_proxy import PgProxy

    settings = "lease = 3\nheartbeat_interval = 1\n"
    proxy = PgProxy(db)
    gone = Supervisor(proxy.url_through, SLOW, supervisor=settings)
    other = Supervisor(db, SLOW, supervisor=settings)
    try:
        gone.start()
        (first,) = enqueue(db, [{"type": "slow", "payload": {"seconds": 0.2}}])
        wait_all_finished(db, 1, timeout=30, sups=[gone])
        proxy.cut()
        gone.signal(signal.SIGTERM)
        assert gone.wait_exit(30) == 0
        proxy.heal()
        assert "could not deregister from the database" in gone.output(), gone.output()[-2000:]
        with psycopg.connect(db) as conn:
            left = conn.execute("SELECT id FROM fairsched_supervisors").fetchall()
        assert len(left) == 1, left
        (gone_id,) = left[0]
        other.start()
        (second,) = enqueue(db, [{"type": "slow", "payload": {"seconds": 0.2}}])
        wait_all_finished(db, 2, timeout=30, sups=[other])

        def row_removed():
            with psycopg.connect(db) as conn:
                return conn.execute("SELECT count(*) FROM fairsched_supervisors WHERE id = %s",
                                    (gone_id,)).fetchone()[0] == 0
        wait_until(row_removed, timeout=30, what="the row left behind removed")
        rows = job_rows(db, {first, second})
        assert [(r[1], r[2], r[5]) for r in rows] == [("succeeded", 1, None)] * 2, rows
        assert "dead supervisors" not in other.output(), other.output()[-2000:]
        ps = other.cli("ps")
        assert ps.returncode == 0 and ps.stderr == "", ps.stderr
    finally:
        gone.close()
        other.close()
        proxy.close()


def test_a_stop_while_the_database_is_out_of_reach_waits_for_it_to_record_outcomes(db):
    # It waits (up to its lease) and records the job's success, not leaving the job to be
    # taken for a dead supervisor's and run again.
    with stopped_while_cut_off(db, "lease = 20\n") as (sup, job, proxy):
        sup.wait_output(r"waiting up to \d+(\.\d)? s for the database to record the outcome of 1 job "
                        r"\(a second SIGTERM")
        time.sleep(1)
        proxy.heal()
        assert sup.wait_exit(30) == 0, sup.output()[-3000:]
        (row,) = job_rows(db, {job})
        assert (row[1], row[2]) == ("succeeded", 1), row


def test_a_stop_the_database_never_answers_ends_in_exit_1_naming_the_jobs(db):
    with stopped_while_cut_off(db, "lease = 3\nheartbeat_interval = 1\n") as (sup, job, _):
        began = time.monotonic()
        assert sup.wait_exit(30) == 1
        assert time.monotonic() - began < 15
        assert re.search(rf"could not record the outcome of 1 job before exiting \({job}\)",
                         sup.output()), sup.output()[-3000:]


def test_a_claim_whose_answer_was_lost_is_returned_as_the_lane_comes_back(db):
    """The claim ran on the server but its answer never came: the lane gives the connection
    up and hands the slot back, and once connected again returns the row it did claim, at
    once. No claim is counted lost to another supervisor, and the job does not wait in
    `running`, run by no worker, for the next heartbeat (10 s here) to return it."""
    from tests.pg_proxy import CLAIM, PgProxy

    proxy = PgProxy(db)
    sup = Supervisor(proxy.url_through, SLOW, supervisor="lease = 30\nheartbeat_interval = 10\n")
    try:
        sup.start()
        proxy.lose_answer_to(CLAIM)
        (job,) = enqueue(db, [{"type": "slow", "payload": {"seconds": 0.1}}])
        sup.wait_output("lost the database: no answer from PostgreSQL", timeout=30)
        wait_all_finished(db, 1, timeout=30, sups=[sup])
        (row,) = job_rows(db, {job})
        assert (row[1], row[2]) == ("succeeded", 1), row  # the lost claim spent no attempt
        assert sup.ps()["supervisor"]["counters"]["claim_losses"] == 0, sup.output()[-3000:]
        # Returned as the connection is made again (its reconcile), not by a later heartbeat.
        out = sup.output()
        returned = out.find(f"returned 1 job to the queue whose claim went through after its "
                            f"connection was given up: {job}")
        assert -1 < returned < out.find("database connection restored"), out[-3000:]
    finally:
        sup.close()
        proxy.close()


def test_an_on_demand_request_runs_once_a_fetch_it_waited_for_is_lost_with_the_database(db):
    """A request that came while a fetch was under way waits for its answer (a queued job may
    outrank it); when the database goes out of reach instead, the connection is given up and
    the request runs at once on the free worker, not once the database is back."""
    from tests.pg_proxy import FETCH, PgProxy

    proxy = PgProxy(db)
    sup = Supervisor(proxy.url_through, SLOW, supervisor="lease = 12\npoll_interval = 1\n")
    try:
        sup.start()
        # The next fetch (the first, or a poll's) hangs; not the query for the next delayed
        # job that follows a short fetch, which the request does not wait for: caught by it
        # (a start slower than the workers'), the request ran at once, no fetch under way.
        proxy.lose_answer_to(FETCH)
        wait_until(lambda: proxy.answer_lost, timeout=10, what="a fetch under way")
        proxy.cut()  # and no connection is made again
        caller = sup.spawn_cli("submit", "slow", "--on-demand", "--timeout", "20",
                               "--payload", '{"seconds": 0.1}')
        out, err = caller.communicate(timeout=40)
        assert caller.returncode == 0, (err, sup.output()[-3000:])
        assert json.loads(out)["slept"] == 0.1
        assert "lost the database: no answer from PostgreSQL within 3 s" in sup.output()
    finally:
        sup.close()
        proxy.close()


@pytest.mark.parametrize("together", [False, True], ids=["later", "in-one-loop-pass"])
def test_a_second_stop_ends_the_waiting(supervisors, together):
    sup = supervisors(SLOW, shutdown_timeout=60).start()
    caller = sup.spawn_cli("submit", "slow", "--on-demand", "--payload",
                           '{"seconds": 60, "ignore_cancel": true}')
    sup.wait_for(lambda ps: ps["slots"][0]["state"] == "busy", what="the job running")
    began = time.monotonic()
    if together:  # both handled before the shutdown has begun: the second is not lost
        sup.signal(signal.SIGSTOP)
        sup.signal(signal.SIGTERM)
        sup.signal(signal.SIGINT)
        time.sleep(0.1)
        sup.signal(signal.SIGCONT)
    else:
        sup.signal(signal.SIGTERM)
        sup.wait_output("shutting down")
        sup.signal(signal.SIGTERM)
    assert sup.wait_exit(30) == 0
    assert time.monotonic() - began < 10
    caller.communicate(timeout=30)
    out = sup.output()
    assert "stop asked again: no more waiting for running jobs or the database" in out, out
    assert re.search(r"worker slow-1 still runs job od-\d+ when stop was asked again; "
                     r"killing it", out), out


def test_release_drill_sigterm_mid_run(supervisors, db, tmp_path):
    log = tmp_path / "runs.log"
    workers = RECORD.format(processes=2, slots=1)
    sup = supervisors(workers).start()
    jobs = [{"type": "rec", "payload": {"log": str(log), "seconds": 0.05, "fail_first": i % 5 == 0}}
            for i in range(100)]
    ids = enqueue(db, jobs)
    failing = {ids[i] for i in range(100) if i % 5 == 0}
    while len(recorded(log)) < 30:
        time.sleep(0.02)
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(30) == 0
    assert "returned to the queue" in sup.output() or len(recorded(log)) < 100
    again = supervisors(workers).start()
    wait_all_finished(db, 100, sups=[again])
    rows = job_rows(db, set(ids))
    logs = sup.output()[-4000:] + again.output()[-4000:]
    assert {r[1] for r in rows} == {"succeeded"}, logs
    assert {r[0] for r in rows if r[2] == 2} == failing, logs
    assert {r[2] for r in rows if r[0] not in failing} == {1}, logs
    counts = recorded(log)
    assert set(counts) == set(ids) and max(counts.values()) == 1


def test_a_job_that_stops_early_at_shutdown_goes_back_to_the_queue(supervisors, db, tmp_path):
    # Both handlers get the cancel of the shutdown: the one that stops early did not finish
    # its job, which goes back to pending with its attempt unspent; the one that finishes
    # its work anyway succeeds.
    sup = supervisors(SLOW + """\
slots = 2
""", shutdown_timeout=10).start()
    early, stubborn = enqueue(db, [
        {"type": "slow", "payload": {"seconds": 60}},
        {"type": "slow", "payload": {"seconds": 1.5, "ignore_cancel": True}}])
    sup.wait_for(lambda ps: {s["job_id"] for s in ps["slots"]} == {early, stubborn},
                 what="both jobs running")
    sup.signal(signal.SIGTERM)
    assert sup.wait_exit(30) == 0
    rows = {r[0]: r for r in job_rows(db)}
    assert rows[early][1:3] == ("pending", 0), sup.output()[-3000:]
    assert rows[stubborn][1:3] == ("succeeded", 1), sup.output()[-3000:]
    assert f"job {early} returned to the queue (shutdown)" in sup.output()
    with psycopg.connect(db) as conn:
        (result,) = conn.execute("SELECT result FROM fairsched_jobs WHERE id = %s",
                                 (stubborn,)).fetchone()
    assert result["slept"] == 1.5


def test_outcomes_postgresql_cannot_store_as_they_are_block_nothing(supervisors, db):
    # A result with a lone surrogate (text from a broken PDF, say) cannot go into jsonb as it
    # is, nor an error into a text column: the result is kept as its JSON text and given back
    # whole, the error spelled out; every other job succeeds.
    sup = supervisors("""
[[worker]]
name = "awk"
types = ["awk"]
handler = "sup_handlers:awkward"
slots = 4
""").start()
    jobs = [{"type": "awk", "payload": {"do": "plain"}} for _ in range(20)]
    jobs[5] = {"type": "awk", "payload": {"do": "result"}}
    jobs[9] = {"type": "awk", "payload": {"do": "error"}, "max_attempts": 1}
    ids = enqueue(db, jobs)
    wait_all_finished(db, 20, timeout=30, sups=[sup])
    rows = {r[0]: r for r in job_rows(db)}
    bad_result, bad_error = ids[5], ids[9]
    assert {r[1] for i, r in rows.items() if i != bad_error} == {"succeeded"}
    with psycopg.connect(db) as conn:
        assert Queue(conn).get_job(bad_result)["result"] == {"text": "a broken \ud800 pair"}
    assert rows[bad_error][1] == "failed"
    assert "a broken \\ud800 pair and a NUL \\0" in rows[bad_error][5], rows[bad_error][5]
    assert "Traceback" not in sup.output()
    assert "could not be stored" not in sup.output()


def test_a_timeout_costs_the_jobs_beside_it_no_attempt(supervisors, db):
    # Two slots in one worker: the hung job's timeout stops the worker, and the job beside it
    # (cooperative, it stops early) goes back to the queue and succeeds on the next worker.
    sup = supervisors(SLOW + """\
slots = 2
timeout = 3
max_attempts = 1
""").start()
    (hung,) = enqueue(db, [{"type": "slow", "payload": {"seconds": 30, "ignore_cancel": True}}])
    sup.wait_for(lambda ps: any(s["job_id"] == hung for s in ps["slots"]), what="hung job")
    time.sleep(0.8)
    (beside,) = enqueue(db, [{"type": "slow", "payload": {"seconds": 2.5}}])
    sup.wait_for(lambda ps: {s["job_id"] for s in ps["slots"]} == {hung, beside},
                 what="both jobs running")
    wait_all_finished(db, 2, timeout=30, sups=[sup])
    rows = {r[0]: r for r in job_rows(db)}
    assert rows[hung][1] == "failed" and rows[hung][5] == "timed out after 3 s"
    assert rows[beside][1:3] == ("succeeded", 1), sup.output()[-3000:]
    assert f"job {beside} returned to the queue (restart)" in sup.output()


def test_a_cancel_too_late_to_stop_a_job_leaves_it_succeeded(supervisors, db):
    sup = supervisors(SLOW).start()
    (job,) = enqueue(db, [{"type": "slow", "payload": {"seconds": 3, "ignore_cancel": True}}])
    sup.wait_for(lambda ps: ps["slots"][0]["job_id"] == job, what="the job running")
    assert sup.cli("cancel", str(job)).returncode == 0
    wait_all_finished(db, 1, timeout=30, sups=[sup])
    with psycopg.connect(db) as conn:
        status, result = conn.execute("SELECT status, result FROM fairsched_jobs WHERE id = %s",
                                      (job,)).fetchone()
    assert status == "succeeded" and result["slept"] == 3  # the work was done: not thrown away


def test_two_jobs_timing_out_on_one_worker_both_fail_their_attempt(supervisors, db):
    # The second one times out while the worker stops for the first: it is not one of the
    # bystanders a timeout hands back, or the two would come back and time out for ever.
    sup = supervisors(SLOW + """\
slots = 2
timeout = 2
max_attempts = 1
""").start()
    stubborn = {"type": "slow", "payload": {"seconds": 30, "ignore_cancel": True}}
    (first,) = enqueue(db, [stubborn])
    sup.wait_for(lambda ps: any(s["job_id"] == first for s in ps["slots"]), what="first job")
    time.sleep(1)
    (second,) = enqueue(db, [stubborn])
    wait_all_finished(db, 2, timeout=30, sups=[sup])
    rows = {r[0]: r[1:3] + (r[5],) for r in job_rows(db)}
    assert rows == {first: ("failed", 1, "timed out after 2 s"),
                    second: ("failed", 1, "timed out after 2 s")}, sup.output()[-3000:]


def test_delayed_job_starts_on_time_and_cancel_reaches_a_running_job(supervisors, db, tmp_path):
    log = tmp_path / "runs.log"
    sup = supervisors(SLOW + RECORD.format(processes=1, slots=1)).start()
    delayed = sup.cli("submit", "rec", "--delay", "1.5", "--payload",
                      json.dumps({"log": str(log)}))
    assert delayed.returncode == 0, delayed.stderr
    delayed_id = int(delayed.stdout)
    long = sup.cli("submit", "slow", "--payload", '{"seconds": 60}')
    long_id = int(long.stdout)
    sup.wait_for(lambda ps: any(s["job_id"] == long_id for s in ps["slots"]), what="long job")
    cancelled = sup.cli("cancel", str(long_id))
    assert cancelled.returncode == 0, cancelled.stderr
    wait_all_finished(db, 2, timeout=30, sups=[sup])
    rows = {r[0]: r for r in job_rows(db)}
    assert rows[long_id][1] == "cancelled"
    assert rows[delayed_id][1] == "succeeded"
    waited = (rows[delayed_id][3] - rows[delayed_id][4]).total_seconds()
    assert 1.5 <= waited < 3.5, waited  # woken by its run_after, not by the 5 s poll
    listing = sup.cli("jobs", "--json")
    assert {j["id"]: j["status"] for j in json.loads(listing.stdout)} == {
        long_id: "cancelled", delayed_id: "succeeded"}


def test_a_cancel_whose_notification_was_lost_still_reaches_the_job(supervisors, db):
    # The table says "cancel" and no notification came (its connection was down): the next
    # heartbeat passes it on.
    sup = supervisors(SLOW, supervisor="heartbeat_interval = 0.5\n").start()
    (job,) = enqueue(db, [{"type": "slow", "payload": {"seconds": 60}}])
    sup.wait_for(lambda ps: ps["slots"][0]["job_id"] == job, what="the job running")
    with psycopg.connect(db, autocommit=True) as conn:  # a cancel_job without its NOTIFY
        conn.execute("UPDATE fairsched_jobs SET cancel_requested = true WHERE id = %s", (job,))
    wait_all_finished(db, 1, timeout=15, sups=[sup])
    (row,) = job_rows(db, {job})
    assert row[1] == "cancelled", row


def test_a_claim_under_way_at_shutdown_leaves_its_job_pending(supervisors, db):
    sup = supervisors(SLOW).start()
    (job,) = enqueue(db, [{"type": "slow", "delay": 1}])
    with psycopg.connect(db) as blocker:
        blocker.execute("LOCK TABLE fairsched_jobs IN EXCLUSIVE MODE")  # reads go on
        deadline = time.monotonic() + 20
        with psycopg.connect(db, autocommit=True) as watch:
            while not watch.execute("SELECT count(*) FROM pg_stat_activity WHERE"
                                    " wait_event_type = 'Lock' AND query LIKE '%%UPDATE fairsched_jobs%%'"
                                    ).fetchone()[0]:
                assert time.monotonic() < deadline, "no claim waited for the row"
                time.sleep(0.05)
        sup.signal(signal.SIGTERM)  # the claim is under way
        time.sleep(0.5)
    # The supervisor waited for the claim's answer (a round trip's allowance, a quarter of
    # the 15 s lease) and handed the row it won straight back: the job is pending, its
    # attempt unspent, and its one claim shows that the claim did go through.
    assert sup.wait_exit(timeout=30) == 0
    with psycopg.connect(db) as conn:
        row = conn.execute("SELECT status, attempts, claims, claimed_by FROM fairsched_jobs"
                           " WHERE id = %s", (job,)).fetchone()
    assert row == ("pending", 0, 1, None), (row, sup.output())


def test_the_supervisors_connections_say_whose_they_are(supervisors, db):
    sup = supervisors(SLOW).start()
    wanted = {f"fairsched {lane} (pid {sup.proc.pid})"
              for lane in ("claims", "outcomes", "notifications")}
    deadline = time.monotonic() + 20
    with psycopg.connect(db, autocommit=True) as conn:
        while True:
            names = {row[0] for row in conn.execute(
                "SELECT application_name FROM pg_stat_activity")}
            if wanted <= names or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert wanted <= names, names


def test_a_lone_supervisor_never_loses_a_claim_to_itself(supervisors, db, tmp_path):
    # Rows reserved while a fetch is in flight must not come back as candidates: claiming
    # them twice would lose the second claim (and waste a round trip) every time.
    log = tmp_path / "runs.log"
    sup = supervisors(RECORD.format(processes=2, slots=16)).start()
    enqueue(db, [{"type": "rec", "payload": {"log": str(log)}} for _ in range(3000)])
    wait_all_finished(db, 3000, sups=[sup])
    counters = sup.ps()["supervisor"]["counters"]
    assert counters["succeeded"] == 3000
    assert counters["claim_losses"] == 0, counters


def test_a_supervisor_cut_off_from_postgres_gives_its_jobs_back_before_its_lease_ends(db, tmp_path):
    from tests.pg_proxy import PgProxy
    from tests.test_metrics import free_port, scrape_until, value

    workers = """
        [[worker]]
        name = "span"
        types = ["span"]
        handler = "sup_handlers:span"
        processes = 2
        """
    settings = "lease = 2\nheartbeat_interval = 0.5\n"
    log = tmp_path / "spans.log"
    proxy = PgProxy(db)
    port = free_port()
    cut_off = Supervisor(proxy.url_through, workers,
                         supervisor=settings + f'metrics = "127.0.0.1:{port}"\n')
    other = Supervisor(db, workers, supervisor=settings)
    try:
        cut_off.start()
        ids = enqueue(db, [{"type": "span", "payload": {"log": str(log), "seconds": 4}},
                           {"type": "span", "payload": {"log": str(log), "seconds": 4,
                                                        "stubborn": True}}])
        # A slot reserved for a claim shows busy before its job runs: wait for the jobs.
        cut_off.wait_for(lambda ps: all(s["job_id"] is not None for s in ps["slots"])
                         and len(ps["slots"]) == 2, what="both jobs running")
        proxy.cut()
        cut_at = time.monotonic()
        other.start()
        wait_all_finished(db, 2, timeout=60, sups=[other])

        # The other supervisor ran both jobs, and each run found no earlier one still going.
        with psycopg.connect(db) as conn:
            rows = conn.execute("SELECT id, status, attempts, result FROM fairsched_jobs"
                                " WHERE id = ANY(%s) ORDER BY id", (ids,)).fetchall()
        assert [(r[1], r[2]) for r in rows] == [("succeeded", 2), ("succeeded", 2)], rows
        assert [r[3]["overlaps"] for r in rows] == [[], []], log.read_text()
        out = cut_off.output()
        # (A loop late by a second on a loaded machine says so in parentheses.)
        assert re.search(r"could not renew the 2 s lease( \(.*\))?: giving back 2 running "
                         r"queued jobs", out), out
        assert "is still running a job of the expiring lease; killing it" in out, out
        assert time.monotonic() - cut_at < 30
        assert cut_off.proc.poll() is None  # it never gives up on itself
        status = cut_off.ps()["supervisor"]
        assert status["lease_lost"] is True
        # Statements hang on the silent connection (a Unix socket: no TCP timeout applies);
        # after a quarter of the lease without an answer it is given up for lost.
        assert status["database_connected"] is False
        assert "lost the database: no answer from PostgreSQL within 0.5 s" in out, out
        scrape_until(port, lambda s: value(s, "fairsched_lease_lost") == 1, "lease lost metric")
        header = cut_off.cli("ps").stdout.splitlines()[0]
        assert ("database external (disconnected), lease lost: queued jobs given back,"
                " claiming stopped") in header, header

        proxy.heal()
        cut_off.wait_for(lambda ps: not ps["supervisor"]["lease_lost"], what="lease renewed")
        assert "lease renewed: claiming queued jobs again" in cut_off.output()
        scrape_until(port, lambda s: value(s, "fairsched_lease_lost") == 0, "lease renewed metric")
        assert "lease had expired" in cut_off.output()
        more = enqueue(db, [{"type": "span", "payload": {"log": str(log), "seconds": 0}}
                            for _ in range(8)])
        wait_all_finished(db, 10, timeout=60, sups=[cut_off, other])
        assert {r[1] for r in job_rows(db, set(more))} == {"succeeded"}
    finally:
        cut_off.close()
        other.close()
        proxy.close()


def test_a_worker_killed_for_its_expiring_lease_says_so_not_an_operators_restart(db):
    # The database goes silent under a job whose handler does not stop when asked: the
    # supervisor kills its worker before its lease runs out, and ps and the log give that
    # reason, not "restarted by the operator", which no one ran.
    from tests.pg_proxy import PgProxy

    proxy = PgProxy(db)
    sup = Supervisor(proxy.url_through, SLOW, supervisor="lease = 3\nheartbeat_interval = 1\n")
    try:
        sup.start()
        (job,) = enqueue(db, [{"type": "slow",
                               "payload": {"seconds": 60, "ignore_cancel": True}}])
        sup.wait_for(lambda ps: ps["slots"][0]["job_id"] == job, what="the job running")
        proxy.cut()
        (slot,) = sup.wait_for(lambda ps: ps["slots"][0]["last_exit"], what="the kill")["slots"]
        expected = "killed by SIGKILL from the supervisor (still running a job of the expiring lease)"
        assert slot["last_exit"] == expected, slot
        assert slot["restarts"] == 1, slot
        out = sup.output()
        assert f"worker slow-1 {expected}; restarting" in out, out
        assert "restarted by the operator" not in out, out
    finally:
        sup.close()
        proxy.close()


def test_workers_gone_idle_are_not_killed_for_a_lease_running_out(db):
    # A worker whose queued job ended after the last renewal is idle, whatever the lease
    # watchdog last heard: when the lease runs out, its on-demand job runs on, unharmed.
    from tests.pg_proxy import PgProxy

    proxy = PgProxy(db)
    sup = Supervisor(proxy.url_through, SLOW + "processes = 2\n",
                     supervisor="lease = 3\nheartbeat_interval = 1\n")
    try:
        sup.start()
        (job,) = enqueue(db, [{"type": "slow", "payload": {"seconds": 1.5}}])
        sup.wait_for(lambda ps: any(s["job_id"] == job for s in ps["slots"]), what="the job")
        sup.wait_for(lambda ps: all(s["state"] == "free" for s in ps["slots"]),
                     what="the job done", timeout=10)
        proxy.cut()  # before the next renewal could tell the watchdog the worker is idle
        caller = sup.spawn_cli("submit", "slow", "--on-demand", "--payload", '{"seconds": 5}')
        out, err = caller.communicate(timeout=30)
        assert caller.returncode == 0, (err, sup.output())
        assert "killed by the lease watchdog" not in sup.output(), sup.output()
        assert re.search(r"could not renew the 3 s lease( \(.*\))?: claiming stops",
                         sup.output()), sup.output()
    finally:
        sup.close()
        proxy.close()


def test_jobs_queued_while_the_database_was_out_of_reach_start_when_it_is_back(db, tmp_path):
    # Their notifications were lost with the connection: the supervisor fetches afresh when
    # it reconnects instead of waiting for its (here very slow) poll.
    from tests.pg_proxy import PgProxy

    log = tmp_path / "runs.log"
    proxy = PgProxy(db)
    sup = Supervisor(proxy.url_through, RECORD.format(processes=1, slots=2),
                     supervisor="lease = 6\nheartbeat_interval = 1\npoll_interval = 600\n")
    try:
        sup.start(listening=True)  # the first job is found by its notification
        (first,) = enqueue(db, [{"type": "rec", "payload": {"log": str(log)}}])
        wait_all_finished(db, 1, sups=[sup])  # and its type found drained
        proxy.cut()
        sup.wait_for(lambda ps: not ps["supervisor"]["database_connected"], what="disconnected")
        ids = enqueue(db, [{"type": "rec", "payload": {"log": str(log)}} for _ in range(3)])
        proxy.heal()
        wait_all_finished(db, 4, timeout=60, sups=[sup])
        assert recorded(log) == collections.Counter({first: 1, **{i: 1 for i in ids}})
    finally:
        sup.close()
        proxy.close()


def test_after_an_outage_longer_than_the_lease_no_supervisor_takes_the_others_for_dead(
        db, tmp_path):
    # Both supervisors lose PostgreSQL for longer than their lease, while their jobs finish.
    # The first one back must not hand the other's jobs back to the queue before that one has
    # had the time to return and record them: they would run a second time.
    from tests.pg_proxy import PgProxy

    log = tmp_path / "runs.log"
    settings = "lease = 6\nheartbeat_interval = 1\n"
    proxy = PgProxy(db)
    sups = [Supervisor(proxy.url_through, RECORD.format(processes=1, slots=4),
                       supervisor=settings) for _ in range(2)]
    try:
        for sup in sups:
            sup.start()
        enqueue(db, [{"type": "rec", "payload": {"log": str(log), "seconds": 3}}
                     for _ in range(8)])
        for sup in sups:
            sup.wait_for(lambda ps: all(s["state"] == "busy" for s in ps["slots"]),
                         what="every slot busy")
        proxy.cut()  # the jobs finish while both are cut off: their outcomes wait
        time.sleep(8)
        proxy.heal()
        wait_all_finished(db, 8, timeout=60, sups=sups)
        counts = recorded(log)
        assert len(counts) == 8 and max(counts.values()) == 1, (
            counts, sups[0].output()[-2000:], sups[1].output()[-2000:])
        assert {r[1] for r in job_rows(db)} == {"succeeded"}
    finally:
        for sup in sups:
            sup.close()
        proxy.close()


SPAN = """
[[worker]]
name = "span"
types = ["span"]
handler = "sup_handlers:span"
"""  # one process, one slot; settings may follow


def span_lines(log: Path, job: int) -> list[list[str]]:
    if not log.exists():
        return []
    return [ln.split() for ln in log.read_text().splitlines() if ln.split()[1] == str(job)]


def test_a_frozen_supervisors_worker_ends_its_job_before_another_takes_it_over(
        supervisors, db, tmp_path):
    # Frozen past its lease (SIGSTOP; a swapping host, say), a supervisor cannot fence; its
    # lease watchdog kills the worker, and what the job started, before the job is handed to
    # another supervisor, so the job never runs in two places at once.
    settings = "lease = 2\nheartbeat_interval = 0.5\n"
    log = tmp_path / "spans.log"
    frozen = supervisors(SPAN, supervisor=settings).start()
    (job,) = enqueue(db, [{"type": "span",
                           "payload": {"log": str(log), "seconds": 6, "child": True}}])
    frozen.wait_for(lambda ps: ps["slots"][0]["job_id"] == job, what="the job running")
    first_pid = frozen.ps()["slots"][0]["pid"]
    other = supervisors(SPAN, supervisor=settings).start()
    frozen.signal(signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 30
        while len([ln for ln in span_lines(log, job) if ln[0] == "start"]) < 2:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        first_child = int([ln for ln in span_lines(log, job) if ln[0] == "child"][0][2])
        assert not alive(first_child)  # the first run's helper went with its worker
        wait_all_finished(db, 1, sups=[other])
    finally:
        frozen.signal(signal.SIGCONT)
    lines = span_lines(log, job)
    assert [ln[:3] for ln in lines if ln[0] != "child" and ln[2] == str(first_pid)] == [
        ["start", str(job), str(first_pid)]]
    with psycopg.connect(db) as conn:
        status, result = conn.execute("SELECT status, result FROM fairsched_jobs WHERE id = %s",
                                      (job,)).fetchone()
    assert status == "succeeded" and result["pid"] != first_pid
    assert result["overlaps"] == []  # the first run had ended when the second started
    frozen.wait_for(lambda ps: ps["slots"][0]["state"] == "free", what="its worker back")
    # The hand-back is said once the table has answered it, which may come after the slot
    # shows free: wait for the line itself.
    frozen.wait_output("lease had expired")
    out = frozen.output()
    assert ("worker span-1 was killed by the lease watchdog: this supervisor did not renew its"
            " lease for 1.8 s (stalled or stopped?)") in out, out
    assert "worker span-1 killed by the lease watchdog; restarting" in out, out
    with psycopg.connect(db) as conn:  # nothing the frozen one did later changed the row
        assert conn.execute("SELECT status, attempts FROM fairsched_jobs WHERE id = %s",
                            (job,)).fetchone() == ("succeeded", 2)


def test_a_job_whose_worker_was_killed_says_how(supervisors, db):
    sup = supervisors(SLOW + """\
max_attempts = 1
""").start()
    for done in range(1, 4):
        (job,) = enqueue(db, [{"type": "slow", "payload": {"seconds": 30}}])
        ps = sup.wait_for(lambda ps, job=job: ps["slots"][0]["job_id"] == job, what="the job running")
        os.kill(ps["slots"][0]["pid"], signal.SIGKILL)
        wait_all_finished(db, done, timeout=30, sups=[sup])
        (row,) = job_rows(db, {job})
        assert row[1:3] == ("failed", 1)
        assert row[5] == "worker slow-1 killed by SIGKILL from outside fairsched (not the OOM killer)", row[5]


def test_a_job_that_finished_while_its_supervisor_was_stalled_succeeds(supervisors, db,
                                                                       tmp_path):
    # One job finishes while the supervisor is stopped; then the lease watchdog kills the
    # worker over the other one. Back, the supervisor reads the result the worker wrote before
    # it died, rather than failing the job for the broken pipe or killing the worker over it.
    log = tmp_path / "spans.log"
    sup = supervisors(SPAN + "slots = 2\n", supervisor="lease = 3\nheartbeat_interval = 1\n"
                      ).start()
    long_job, short_job = enqueue(db, [
        {"type": "span", "payload": {"log": str(log), "seconds": 60}},
        {"type": "span", "payload": {"log": str(log), "seconds": 0.8}}])
    sup.wait_for(lambda ps: {s["job_id"] for s in ps["slots"]} == {long_job, short_job},
                 what="both jobs running")
    sup.signal(signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 10
        while not [ln for ln in span_lines(log, short_job) if ln[0] == "end"]:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        time.sleep(3)  # past the watchdog's 90% of the lease
    finally:
        sup.signal(signal.SIGCONT)
    sup.wait_for(lambda ps: ps["supervisor"]["counters"]["succeeded"] == 1, what="the result")
    (row,) = job_rows(db, {short_job})
    assert row[1:3] == ("succeeded", 1) and row[5] is None, row
    out = sup.output()
    assert f"job {short_job} succeeded" in out and "pipe closed" not in out, out
    assert "worker span-1 was killed by the lease watchdog" in out, out


def test_a_job_that_holds_the_gil_past_the_lease_runs_to_its_end(supervisors, db):
    # The lease is the supervisor's to keep, not the worker's: a busy worker is not mistaken
    # for a stalled supervisor.
    sup = supervisors("""
[[worker]]
name = "gil"
types = ["gil"]
handler = "sup_handlers:hold_gil"
""", supervisor="lease = 2\nheartbeat_interval = 0.5\n").start()
    (job,) = enqueue(db, [{"type": "gil", "payload": {"seconds": 3}}])
    wait_all_finished(db, 1, timeout=60, sups=[sup])
    (row,) = job_rows(db, {job})
    assert row[1:3] == ("succeeded", 1), row
    assert "watchdog" not in sup.output()


def watchdogs(parent: psutil.Process) -> list[psutil.Process]:
    found = []
    for p in parent.children():
        try:
            if "fairsched.supervisor.watchdog" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:  # a child that just exited
            pass
    return found


def wait_for_watchdogs(parent: psutil.Process) -> list[psutil.Process]:
    deadline = time.monotonic() + 10
    while not watchdogs(parent):
        assert time.monotonic() < deadline, "no lease watchdog"
        time.sleep(0.05)
    return watchdogs(parent)


def test_a_lease_watchdog_that_dies_is_started_again(supervisors, db):
    sup = supervisors(SLOW).start()
    parent = psutil.Process(sup.proc.pid)
    (first,) = wait_for_watchdogs(parent)
    first.kill()
    deadline = time.monotonic() + 10
    while not [p for p in watchdogs(parent) if p.pid != first.pid]:
        assert time.monotonic() < deadline, sup.output()
        time.sleep(0.05)
    assert "the lease watchdog ended (killed by SIGKILL" in sup.output(), sup.output()
    assert "starting it again in 1 s" in sup.output(), sup.output()
    (job,) = enqueue(db, [{"type": "slow", "payload": {"seconds": 0.1}}])
    wait_all_finished(db, 1, sups=[sup])  # and the supervisor works on


def test_a_lease_watchdog_that_stops_answering_is_replaced(supervisors, db):
    sup = supervisors(SLOW, supervisor="heartbeat_interval = 0.5\n").start()
    parent = psutil.Process(sup.proc.pid)
    (first,) = wait_for_watchdogs(parent)
    first.suspend()  # SIGSTOP: alive, but it could not kill anything on time
    deadline = time.monotonic() + 15
    while not [p for p in watchdogs(parent) if p.pid != first.pid]:
        assert time.monotonic() < deadline, sup.output()
        time.sleep(0.05)
    assert not alive(first.pid)
    assert re.search(rf"the lease watchdog \(pid {first.pid}\) has not answered for [56] s "
                     r"\(stopped\?\); killing it and starting another", sup.output()), sup.output()
    assert "the lease watchdog ended" not in sup.output()
    (job,) = enqueue(db, [{"type": "slow", "payload": {"seconds": 0.1}}])
    wait_all_finished(db, 1, sups=[sup])  # and the supervisor works on


def test_a_stopped_lease_watchdog_does_not_outlive_its_supervisor(supervisors, db):
    sup = supervisors(SLOW).start()
    (dog,) = wait_for_watchdogs(psutil.Process(sup.proc.pid))
    dog.suspend()
    try:
        assert sup.cli("stop").returncode == 0
        assert sup.wait_exit() == 0
        assert not alive(dog.pid)
    finally:
        with contextlib.suppress(psutil.Error):
            dog.resume()


def test_what_a_killed_worker_started_dies_with_it(supervisors, db, tmp_path):
    sup = supervisors("""
[[worker]]
name = "parent"
types = ["parent"]
handler = "sup_handlers:with_child"
max_attempts = 1
""").start()
    pidfile = tmp_path / "child.pid"
    (job,) = enqueue(db, [{"type": "parent", "payload": {"pidfile": str(pidfile)}}])
    ps = sup.wait_for(lambda ps: ps["slots"][0]["job_id"] == job and pidfile.exists()
                      and pidfile.read_text(), what="the job's child running")
    child = int(pidfile.read_text())
    os.kill(ps["slots"][0]["pid"], signal.SIGKILL)  # the worker alone, as the OOM killer does
    wait_all_finished(db, 1, timeout=30, sups=[sup])
    deadline = time.monotonic() + 10
    while alive(child):
        assert time.monotonic() < deadline, f"the job's child {child} outlived its worker"
        time.sleep(0.05)
    # Orphaned, the child was the supervisor's to reap (it is their subreaper): no zombie stays.
    wait_until(lambda: not zombie_children(sup.proc.pid), 10,
               lambda: f"zombies {zombie_children(sup.proc.pid)} reaped")


def test_orphans_jobs_leave_behind_are_reaped_as_they_end(supervisors, db, tmp_path):
    # The supervisor is their subreaper: each becomes its child, and a zombie until reaped.
    sup = supervisors("""
[[worker]]
name = "orphans"
types = ["orphans"]
handler = "sup_handlers:leaves_orphans"
""").start()
    enqueue(db, [{"type": "orphans", "payload": {"n": 40}}])
    wait_all_finished(db, 1, timeout=60, sups=[sup])
    time.sleep(0.6)  # the last of them ended 0.2 s after the job
    wait_until(lambda: not zombie_children(sup.proc.pid), 1.5,
               lambda: f"{len(zombie_children(sup.proc.pid))} zombies reaped")


def zombie_children(pid: int) -> list[int]:
    zombies = []
    for child in psutil.Process(pid).children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.status() == psutil.STATUS_ZOMBIE:
                zombies.append(child.pid)
    return zombies


def test_a_worker_stopped_from_outside_takes_no_more_work_and_comes_back(supervisors, db):
    # SIGTERM from someone else: the worker finishes its job and refuses new ones. The job it
    # refuses must not bounce between it and the queue until it exits.
    sup = supervisors(SLOW + """\
slots = 2
""").start()
    (first,) = enqueue(db, [{"type": "slow", "payload": {"seconds": 2, "ignore_cancel": True}}])
    ps = sup.wait_for(lambda ps: any(s["job_id"] == first for s in ps["slots"]), what="running")
    os.kill(ps["slots"][0]["pid"], signal.SIGTERM)
    time.sleep(0.3)
    (second,) = enqueue(db, [{"type": "slow", "payload": {"seconds": 0.1}}])
    wait_all_finished(db, 2, timeout=30, sups=[sup])
    assert {r[0]: r[1:3] for r in job_rows(db)} == {first: ("succeeded", 1),
                                                    second: ("succeeded", 1)}
    assert sup.output().count(f"refused job {second}") <= 1, sup.output()[-3000:]


def test_a_claim_whose_answer_was_lost_goes_back_to_the_queue(supervisors, db, tmp_path):
    """A claim that committed after its connection was given up leaves a row running under a
    live supervisor that none of its workers runs, which no rescue would ever touch: its next
    heartbeat returns it to the queue, without spending the attempt, and it runs once."""
    log = tmp_path / "runs.log"
    sup = supervisors(RECORD.format(processes=1, slots=1),
                      supervisor="heartbeat_interval = 0.3\n").start()
    me = sup.ps()["supervisor"]["id"]
    with psycopg.connect(db, autocommit=True) as conn:
        (ghost,) = conn.execute(
            "INSERT INTO fairsched_jobs (type, payload, status, attempts, claimed_by, started_at)"
            " VALUES ('rec', %s, 'running', 1, %s, now()) RETURNING id",
            (json.dumps({"log": str(log)}), me)).fetchone()
    wait_all_finished(db, 1, timeout=30, sups=[sup])
    assert [r[:3] for r in job_rows(db)] == [(ghost, "succeeded", 1)]
    assert recorded(log) == {ghost: 1}
    assert (f"returned 1 job to the queue whose claim went through after its connection was"
            f" given up: {ghost}") in sup.output()


def test_a_supervisor_without_its_database_exits_1_and_leaves_no_worker_behind():
    """Workers start while the database connects; when it cannot, they are stopped again."""
    import psutil

    sup = Supervisor("postgresql://x@/db?host=/nonexistent", RECORD.format(processes=2, slots=1))
    try:
        sup.start(wait=False)
        assert sup.wait_exit() == 1
        lines = sup.output().strip().splitlines()
        assert lines[-1].startswith("fairsched: cannot connect to PostgreSQL at "), lines
        assert "Traceback" not in sup.output()
        time.sleep(0.2)
        left = []
        for p in psutil.process_iter(["cmdline", "environ"]):
            seen = " ".join(p.info["cmdline"] or []) + " ".join((p.info["environ"] or {}).values())
            if sup.dir.name in seen and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p.pid)
        assert left == []
    finally:
        sup.close()


def test_a_payload_no_worker_could_read_fails_its_job_and_nothing_else(supervisors, db,
                                                                        tmp_path):
    """Enqueue refuses payloads too large for a frame or nested too deeply for a worker's
    decoder; one written by hand fails for good when claimed, and its worker lives on."""
    log = tmp_path / "runs.log"
    sup = supervisors(RECORD.format(processes=1, slots=1)).start()
    pid = sup.slots("rec")[0]["pid"]
    with psycopg.connect(db, autocommit=True) as conn:
        (big,) = conn.execute(
            "INSERT INTO fairsched_jobs (type, payload) VALUES ('rec', jsonb_build_object("
            "'log', %s::text, 'pad', repeat('x', 1100000))) RETURNING id", (str(log),)).fetchone()
        (deep,) = conn.execute(
            "INSERT INTO fairsched_jobs (type, payload) VALUES ('rec', jsonb_build_object("
            "'log', %s::text, 'deep', %s::jsonb)) RETURNING id",
            (str(log), "[" * 3000 + "]" * 3000)).fetchone()
    (small,) = enqueue(db, [{"type": "rec", "payload": {"log": str(log)}}])
    wait_all_finished(db, 3, sups=[sup])
    rows = {r[0]: r for r in job_rows(db)}
    assert rows[big][1] == "failed" and rows[big][2] == 1
    assert rows[big][5].startswith("the payload cannot be sent to a worker: frame of ")
    assert rows[deep][1] == "failed" and rows[deep][2] == 1
    assert rows[deep][5] == ("the payload cannot be sent to a worker: "
                             "payload nests deeper than 500 levels")
    assert rows[small][1] == "succeeded"
    assert recorded(tmp_path / "runs.log") == {small: 1}
    assert sup.proc.poll() is None
    assert sup.slots("rec")[0]["pid"] == pid
    listing = sup.cli("jobs", "--json")  # the listing shows such a row too
    assert listing.returncode == 0, listing.stderr
    assert {j["id"] for j in json.loads(listing.stdout)} == {big, deep, small}


def test_a_payload_number_too_long_for_a_workers_decoder_fails_its_job_and_nothing_else(
        supervisors, db, tmp_path):
    """jsonb keeps numbers of any length and prints them out in full ('1e5000' comes back as
    5001 digits), past what a Python worker's JSON decoder reads: such a payload, written by
    hand, fails its job for good when claimed, and its worker lives on."""
    log = tmp_path / "runs.log"
    sup = supervisors(RECORD.format(processes=1, slots=1)).start()
    pid = sup.slots("rec")[0]["pid"]
    with psycopg.connect(db, autocommit=True) as conn:
        (long,) = conn.execute(
            "INSERT INTO fairsched_jobs (type, payload) VALUES ('rec', jsonb_build_object("
            "'log', %s::text, 'n', '1e5000'::jsonb)) RETURNING id", (str(log),)).fetchone()
        (text,) = conn.execute(  # as many digits in a string are no number: it runs
            "INSERT INTO fairsched_jobs (type, payload) VALUES ('rec', jsonb_build_object("
            "'log', %s::text, 'digits', repeat('7', 5000))) RETURNING id",
            (str(log),)).fetchone()
    wait_all_finished(db, 2, sups=[sup])
    rows = {r[0]: r for r in job_rows(db)}
    assert rows[long][1] == "failed" and rows[long][2] == 1
    assert rows[long][5] == ("the payload cannot be sent to a worker: payload holds a number "
                             "of 5001 digits, past the 4300 a worker's JSON decoder reads")
    assert rows[text][1] == "succeeded"
    assert recorded(log) == {text: 1}
    assert sup.proc.poll() is None
    assert sup.slots("rec")[0]["pid"] == pid


def test_results_sent_just_before_a_restart_are_never_lost(supervisors, db, tmp_path):
    # Restarted workers finish the job at hand, answer and exit at once: their exits are often
    # reaped (SIGCHLD, another worker's exit reaping them too) before their last frames are
    # read. Those frames count first: no job is given back, none runs twice.
    sup = supervisors(RECORD.format(processes=8, slots=1)).start()
    runs = tmp_path / "runs"
    jobs = enqueue(db, [{"type": "rec", "payload": {"log": str(runs), "seconds": 0.2}}] * 120)
    for _ in range(8):
        time.sleep(0.4)
        assert sup.cli("restart", "rec").returncode == 0
    wait_all_finished(db, len(jobs), timeout=180, sups=[sup])
    twice = [job for job, n in recorded(runs).items() if n > 1]
    assert not twice, (twice, sup.output()[-3000:])
    assert [r[1] for r in job_rows(db, set(jobs))] == ["succeeded"] * len(jobs)
    assert re.search(r"worker rec-\d restarted by the operator \(stopping pid \d+\)",
                     sup.output())


def test_a_backlog_of_large_results_is_written_once_the_database_is_back(db):
    # Results gathered while PostgreSQL was out of reach go out in statements of a few MB,
    # each answered well within its time limit, whatever the backlog's size.
    from tests.pg_proxy import PgProxy

    proxy = PgProxy(db)
    sup = Supervisor(proxy.url_through, """
[[worker]]
name = "big"
types = ["big"]
handler = "sup_handlers:big"
slots = 24
""", supervisor="lease = 20\n")
    try:
        sup.start()
        ids = enqueue(db, [{"type": "big", "payload": {"seconds": 1.5, "size": 600_000}}] * 24)
        sup.wait_for(lambda ps: all(s["state"] == "busy" for s in ps["slots"]), what="all busy")
        proxy.cut()
        time.sleep(3)  # every job ends meanwhile: 14 MB of results wait
        proxy.heal()
        wait_all_finished(db, len(ids), timeout=60, sups=[sup])
        with psycopg.connect(db) as conn:
            rows = conn.execute("SELECT id, status, attempts, result->>'id',"
                                " length(result->>'blob') FROM fairsched_jobs").fetchall()
        assert sorted(rows) == [(i, "succeeded", 1, str(i), 600_000) for i in ids]
    finally:
        sup.close()
        proxy.close()


def test_a_statement_of_results_holds_a_few_megabytes_or_a_thousand_rows():
    from fairsched.supervisor.outbox import CHUNK_BYTES, CHUNK_ROWS, completion_chunk

    small = [(i, 1, None) for i in range(2500)]
    assert completion_chunk(small) == small[:CHUNK_ROWS]
    blob = "x" * (CHUNK_BYTES // 3)
    large = [(i, 1, blob) for i in range(10)]
    assert completion_chunk(large) == large[:3]
    huge = [(1, 1, "x" * (CHUNK_BYTES * 2)), (2, 1, None)]
    assert completion_chunk(huge) == huge[:1]  # one result always goes, however large
    assert completion_chunk([]) == []


def started_within(url, ids) -> list[float]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT extract(epoch FROM started_at - created_at) FROM fairsched_jobs"
                            " WHERE id = ANY(%s)", (ids,)).fetchall()
    return [float(r[0]) for r in rows]


def test_a_job_notified_while_a_fetch_runs_is_not_left_for_the_poll(supervisors, db, tmp_path):
    # The second job of each pair commits after the fetch its partner woke has taken its
    # snapshot, and its notification comes while that fetch runs: it must not be taken for
    # drained, or it waits for the next poll (here 600 s) or the next insert.
    sup = supervisors(RECORD.format(processes=1, slots=8),
                      supervisor="poll_interval = 600\n").start(listening=True)
    log = tmp_path / "runs"
    job = {"type": "rec", "payload": {"log": str(log)}}
    ids = []
    with psycopg.connect(db, autocommit=True) as a, psycopg.connect(db, autocommit=True) as b:
        for pair in range(40):
            ids += Queue(a).enqueue_many([job])
            time.sleep(0.001 * (pair % 3))
            ids += Queue(b).enqueue_many([job])
            wait_all_finished(db, len(ids), timeout=30, sups=[sup])
    waits = started_within(db, ids)
    assert len(waits) == len(ids) and max(waits) < 2, sorted(waits)[-5:]


def test_jobs_inserted_while_the_notification_connection_was_down_start_at_once(
        supervisors, db, tmp_path):
    sup = supervisors(RECORD.format(processes=1, slots=2),
                      supervisor="poll_interval = 600\n").start(listening=True)
    log = tmp_path / "runs"
    with psycopg.connect(db, autocommit=True) as conn:
        with conn.transaction():  # the listener goes, and the job's notification with it
            (gone,) = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM"
                                   " pg_stat_activity WHERE query LIKE 'LISTEN %'").fetchone()
            ids = Queue(conn).enqueue_many([{"type": "rec", "payload": {"log": str(log)}}])
    assert gone >= 1
    wait_all_finished(db, 1, timeout=30, sups=[sup])
    assert started_within(db, ids)[0] < 3


# A host whose clock is off: what `fairsched jobs` run there sees of time (its time.time and
# datetime.now), the database server's clock being right.
SHIFTED_CLOCK = """
import datetime as _dt, os as _os, time as _time
_shift = float(_os.environ["FAIRSCHED_TEST_CLOCK_SHIFT"])
_real_time = _time.time
_time.time = lambda: _real_time() + _shift
class _ShiftedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return _dt.datetime.fromtimestamp(_time.time(), tz)
_dt.datetime = _ShiftedDatetime
"""


@pytest.mark.parametrize("shift", [-3600.0, 3600.0])
def test_jobs_on_a_host_whose_clock_is_off_says_what_the_queue_does(supervisors, db, tmp_path,
                                                                   shift):
    sup = supervisors(SLOW).start()
    (due,) = enqueue(db, [{"type": "unhandled"}])  # no supervisor runs it: it stays pending
    delayed = int(sup.cli("submit", "slow", "--delay", "600").stdout)
    (tmp_path / "sitecustomize.py").write_text(SHIFTED_CLOCK)
    env = dict(sup.env, PYTHONPATH=os.pathsep.join([str(tmp_path), str(Path.cwd())]),
               FAIRSCHED_TEST_CLOCK_SHIFT=str(shift))
    listing = subprocess.run([sys.executable, "-m", "fairsched", "jobs"], env=env,
                             capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0, listing.stderr
    lines = {int(line.split()[0]): line for line in listing.stdout.splitlines()[1:]}
    assert re.search(r"\bpending\s+0/-\s+\d+s\b", lines[due]), listing.stdout  # due, 0 s old
    assert re.search(r"pending \(in (9m[0-9]{2}s|10m00s)\)\s+0/3\s+\d+s\b",
                     lines[delayed]), listing.stdout
    (row,) = [r for r in job_rows(db) if r[0] == due]
    assert row[1] == "pending"


def test_retry_and_cancel_racing_a_job_that_ends_say_what_they_found(supervisors, db):
    # Retries and cancels sent while the job's attempts end (each fails, for good, as it runs)
    # and while other retries and cancels land: each either does what was asked or says why
    # not, and the "why" is never the very status it takes ("job 5 is failed; only failed or
    # cancelled jobs can be retried"). Every retry said done is one more run of the job.
    sups = [supervisors("""
[[worker]]
name = "f"
types = ["f"]
handler = "sup_handlers:fail_later"
processes = 2
slots = 2
max_attempts = 1
""").start() for _ in range(2)]
    ids = enqueue(db, [{"type": "f", "payload": {"seconds": 0.01 * (i % 3),
                                                 "permanent": i % 2 == 0}} for i in range(12)])
    retried = collections.Counter()
    refused: list[str] = []
    stop = time.monotonic() + 8
    seed = iter(range(1000))

    def user():
        rng = random.Random(next(seed))
        with psycopg.connect(db, autocommit=True) as conn:
            queue = Queue(conn)
            while time.monotonic() < stop:
                job = rng.choice(ids)
                try:
                    if rng.random() < 0.8:
                        queue.retry_job(job)
                        retried[job] += 1
                    else:
                        queue.cancel_job(job)
                except JobStateError as exc:
                    refused.append(str(exc))

    users = [threading.Thread(target=user) for _ in range(4)]
    for thread in users:
        thread.start()
    for thread in users:
        thread.join()
    wait_all_finished(db, len(ids), timeout=60, sups=sups)
    contradictions = [m for m in refused if re.search(
        r"is (failed|cancelled); only failed or cancelled|already (pending|running);", m)]
    assert not contradictions, contradictions[:5]
    with psycopg.connect(db) as conn:
        runs = dict(conn.execute("SELECT id, claims FROM fairsched_jobs").fetchall())
    assert all(runs[job] <= 1 + retried[job] for job in ids), (runs, retried)


def test_an_idle_supervisor_frozen_past_its_lease_says_no_job_was_lost(supervisors, db):
    # Its row was rescued, but nothing of the queue ran there: no results go unrecorded.
    settings = "lease = 2\nheartbeat_interval = 0.5\n"
    frozen = supervisors(SPAN, supervisor=settings).start()
    other = supervisors(SPAN, supervisor=settings).start()
    frozen_id = frozen.ps()["supervisor"]["id"]
    frozen.signal(signal.SIGSTOP)
    try:
        def registered() -> set:
            with psycopg.connect(db) as conn:
                return {r[0] for r in conn.execute("SELECT id FROM fairsched_supervisors")}

        wait_until(lambda: frozen_id not in registered(), timeout=30,
                   what="the frozen supervisor's row rescued")
    finally:
        frozen.signal(signal.SIGCONT)
    wait_until(lambda: "lease had expired" in frozen.output(), timeout=15,
               what=lambda: f"the frozen one finding out\n{frozen.output()[-2000:]}")
    out = frozen.output()
    assert ("this supervisor's lease had expired while no job of the queue ran here: "
            "registered again") in out, out
    assert "their results here will not be recorded" not in out, out
    assert other.proc.poll() is None
