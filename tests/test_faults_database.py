"""The durable queue when the database misbehaves without going away: locks held by others,
timeouts set for other applications, connections ended from the server's side."""

import threading
import time

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from fairsched.store.queue import Queue
from tests.conftest import heartbeat_at, server_now
from tests.supervisor_harness import wait_until

RECORD = """
[[worker]]
name = "rec"
types = ["rec"]
handler = "sup_handlers:record"
processes = 2
slots = 2
retry_backoff = 0.05
"""


def enqueue(url, jobs):
    with psycopg.connect(url, autocommit=True) as conn:
        return Queue(conn).enqueue_many(jobs)


def statuses(url) -> dict:
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT status, count(*) FROM fairsched_jobs GROUP BY 1"))


def backends_of(url, pid: int, waiting_on_a_lock: bool = False) -> int:
    with psycopg.connect(url) as conn:
        (n,) = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s"
            " AND (NOT %s OR wait_event_type = 'Lock')",
            (f"fairsched % (pid {pid})", waiting_on_a_lock)).fetchone()
    return n


def sessions(conn) -> int:
    """The sessions ever opened on the database of `conn` (an autocommit connection)."""
    return conn.execute("SELECT sessions FROM pg_stat_database"
                        " WHERE datname = current_database()").fetchone()[0]


def running_jobs(supervisors, db, tmp_path, *, lease: float, seconds: float):
    """A supervisor with `lease`, 20 jobs of `seconds` each enqueued, the first one done:
    (the supervisor, the job ids, the file their runs are recorded in)."""
    sup = supervisors(RECORD, supervisor=f"lease = {lease}\n").start()
    log = tmp_path / "runs"
    ids = enqueue(db, [{"type": "rec", "payload": {"log": str(log), "seconds": seconds}}
                       for _ in range(20)])
    wait_until(lambda: statuses(db).get("succeeded"), what="a first job done")
    return sup, ids, log


def test_a_table_lock_held_past_the_lease_leaves_no_backend_behind(supervisors, db, tmp_path):
    # Each lane gives a statement that waits on the lock up and reconnects; the server must
    # end the statement it gave up, or one more backend waits on the lock per reconnection.
    sup, ids, _ = running_jobs(supervisors, db, tmp_path, lease=4, seconds=0.5)
    most = 0
    with psycopg.connect(db) as locker:
        locker.execute("LOCK TABLE fairsched_jobs IN ACCESS EXCLUSIVE MODE")
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            most = max(most, backends_of(db, sup.proc.pid, waiting_on_a_lock=True))
            time.sleep(0.2)
        locker.rollback()
    wait_until(lambda: statuses(db) == {"succeeded": len(ids)}, timeout=30,
               what=lambda: f"every job done: {statuses(db)}")
    assert most <= 3, f"{most} backends of the supervisor waited on the lock at once"
    assert sup.proc.poll() is None
    wait_until(lambda: backends_of(db, sup.proc.pid) == 3, timeout=10,
               what=lambda: f"3 connections, not {backends_of(db, sup.proc.pid)}")


def test_a_short_statement_timeout_set_for_others_does_not_hold_back_outcomes(supervisors, db,
                                                                             tmp_path):
    # As if the database or role set statement_timeout for the applications beside fairsched.
    sup = supervisors(RECORD, supervisor="lease = 8\n")
    sup.env["FAIRSCHED_DATABASE_URL"] = make_conninfo(db, options="-c statement_timeout=1ms")
    sup.start()
    log = tmp_path / "runs"
    for batch in range(3):  # outcomes then come in batches of many
        enqueue(db, [{"type": "rec", "payload": {"log": str(log)}} for _ in range(300)])
        # The next batch comes while the outcomes of this one are being written.
        wait_until(lambda batch=batch: statuses(db).get("succeeded", 0) > 300 * batch,
                   timeout=30, what=lambda: f"outcomes recorded: {statuses(db)}")
    wait_until(lambda: statuses(db) == {"succeeded": 900}, timeout=60,
               what=lambda: f"every job done: {statuses(db)}\n{sup.output()[-2000:]}")
    assert "statement timeout" not in sup.output()


def test_an_idle_session_timeout_set_for_others_does_not_end_the_supervisors_connections(
        supervisors, db, tmp_path):
    sup = supervisors(RECORD, supervisor="lease = 8\npoll_interval = 600\n")
    sup.env["FAIRSCHED_DATABASE_URL"] = make_conninfo(db, options="-c idle_session_timeout=300ms")
    sup.start(listening=True)
    # A heartbeat after the registration (due lease / 3 later): the connections have been
    # idle far past the timeout meanwhile, the listener's all along.
    registered = server_now(db)
    wait_until(lambda: heartbeat_at(db, sup.ps()["supervisor"]["id"]) > registered,
               what="a heartbeat")
    ids = enqueue(db, [{"type": "rec", "payload": {"log": str(tmp_path / "runs")}}])
    wait_until(lambda: statuses(db) == {"succeeded": len(ids)}, timeout=30,
               what=lambda: f"the job done: {statuses(db)}")
    assert "lost the database" not in sup.output(), sup.output()[-2000:]


def test_a_short_statement_timeout_set_for_others_does_not_stop_the_migration_check(db,
                                                                                  tmp_path):
    from fairsched.store.database import open_database
    from fairsched.store.schema import MIGRATION_LOCK

    with psycopg.connect(db) as other:  # another process migrating: the check waits for it
        other.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        finish = threading.Timer(0.5, other.rollback)
        finish.start()
        try:
            open_database(tmp_path, make_conninfo(db, options="-c statement_timeout=50ms")).close()
        finally:
            finish.join()


def commits(url) -> int:
    with psycopg.connect(url) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        (n,) = conn.execute("SELECT xact_commit FROM pg_stat_database"
                            " WHERE datname = current_database()").fetchone()
    return n


def test_jobs_locked_by_another_transaction_hold_back_neither_the_rest_nor_the_cpu(
        supervisors, db, tmp_path):
    sup = supervisors(RECORD).start()  # 4 free slots: a fetch reads the best 8 of a type
    log = tmp_path / "runs"
    with psycopg.connect(db, autocommit=True) as conn:
        ids = Queue(conn).enqueue_many([{"type": "rec", "payload": {"log": str(log)},
                                         "delay": 2} for _ in range(30)])
    with psycopg.connect(db) as locker:
        locker.execute("SELECT id FROM fairsched_jobs WHERE id <= %s FOR UPDATE", (ids[7],))
        wait_until(lambda: statuses(db) == {"succeeded": 22, "pending": 8}, timeout=20,
                   what=lambda: f"the jobs not locked done: {statuses(db)}")
        # Over one heartbeat interval of the supervisor (3 s, from one heartbeat to the
        # next), less the transactions of the polls that see them.
        supervisor = sup.ps()["supervisor"]["id"]
        polls = 0
        with psycopg.connect(db, autocommit=True) as watch:
            def beat_after(then):
                nonlocal polls
                polls += 1
                (beat,) = watch.execute("SELECT heartbeat_at FROM fairsched_supervisors"
                                        " WHERE id = %s", (supervisor,)).fetchone()
                return beat if then is None or beat > then else None

            seen = beat_after(None)
            first = wait_until(lambda: beat_after(seen), timeout=10, interval=0.1,
                               what="a heartbeat")
            before, polls = commits(db), 0
            last = wait_until(lambda: beat_after(first), timeout=10, interval=0.1,
                              what="the next heartbeat")
            spent = commits(db) - before - polls
        locker.rollback()
    wait_until(lambda: statuses(db) == {"succeeded": 30}, timeout=20,
               what=lambda: f"every job done: {statuses(db)}")
    # A claim lost to the lock and tried again at once would run thousands a second.
    window = (last - first).total_seconds()
    assert spent < 300, f"{spent} transactions in {window:.1f} s while 8 locked jobs waited"
    assert sup.proc.poll() is None


SLOW = """
[[worker]]
name = "slow"
types = ["slow"]
handler = "sup_handlers:slow"
processes = 2
"""


def test_a_supervisors_row_deleted_by_hand_costs_its_running_jobs_nothing(supervisors, db):
    sup = supervisors(SLOW, supervisor="lease = 6\n").start()
    ids = enqueue(db, [{"type": "slow", "payload": {"seconds": 4}} for _ in range(2)])
    sup.wait_for(lambda ps: {s["job_id"] for s in ps["slots"]} == set(ids),
                 what="both jobs running")
    pids = {s["pid"] for s in sup.slots()}
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("DELETE FROM fairsched_supervisors")
    sup.wait_output("row in fairsched_supervisors was gone, but none of its running jobs")
    wait_until(lambda: statuses(db) == {"succeeded": 2}, timeout=20,
               what=lambda: f"both jobs done: {statuses(db)}")
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT max(attempts), max(claims) FROM fairsched_jobs"
                            ).fetchone() == (1, 1)
    assert "returned to the queue" not in sup.output()
    assert {s["pid"] for s in sup.slots()} == pids  # no worker killed


def test_a_job_whose_row_is_deleted_while_it_runs_is_said_to_be_so(supervisors, db):
    sup = supervisors(SLOW).start()
    gone, kept = enqueue(db, [{"type": "slow", "payload": {"seconds": 1}} for _ in range(2)])
    sup.wait_for(lambda ps: gone in {s["job_id"] for s in ps["slots"]}, what="the job running")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("DELETE FROM fairsched_jobs WHERE id = %s", (gone,))
    sup.wait_output(rf"the outcome of 1 job was not recorded: its row was deleted from "
                    rf"fairsched_jobs while it ran: {gone}\n")
    wait_until(lambda: statuses(db) == {"succeeded": 1}, timeout=20,
               what=lambda: f"the other job done: {statuses(db)}")
    assert "lease expired" not in sup.output()


def test_a_database_that_turns_read_only_is_named_so_and_waited_out(supervisors, db, tmp_path):
    # As a failover can leave it: every new session read-only, as on a standby. The supervisor
    # says so once, keeps reconnecting, and goes on when the database takes writes again.
    sup, ids, log = running_jobs(supervisors, db, tmp_path, lease=8, seconds=0.2)
    with psycopg.connect(db, autocommit=True) as admin:
        (name,) = admin.execute("SELECT current_database()").fetchone()
        database = sql.Identifier(name)
        admin.execute(sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on")
                      .format(database))
        try:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                          " WHERE application_name LIKE %s", (f"fairsched % (pid {sup.proc.pid})",))
            wait_until(lambda: "refuses writes" in sup.output(), timeout=10,
                       what=lambda: f"the read-only database named\n{sup.output()[-2000:]}")
            # Reconnecting all the while: each try is a new session, refused its writes.
            tries = sessions(admin)
            wait_until(lambda: sessions(admin) >= tries + 3, timeout=10,
                       what="three more tries to reconnect")
        finally:
            admin.execute("SET default_transaction_read_only = off")
            admin.execute(sql.SQL("ALTER DATABASE {} RESET default_transaction_read_only")
                          .format(database))
    wait_until(lambda: statuses(db) == {"succeeded": len(ids)}, timeout=30,
               what=lambda: f"every job done: {statuses(db)}\n{sup.output()[-2000:]}")
    out = sup.output()
    assert sup.proc.poll() is None
    assert "Traceback" not in out and "lane failed" not in out, out[-3000:]
    assert out.count("refuses writes") == 1, out[-3000:]
    assert "database connection restored" in out
    runs = [line.split()[0] for line in log.read_text().splitlines()]
    assert sorted(map(int, runs)) == sorted(ids), "a job ran twice or not at all"
