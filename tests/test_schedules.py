"""[[schedule]]: validation, each due time enqueued exactly once by supervisors sharing a
database (restarts included), missed times folded into one at start, `fairsched schedules`."""

from __future__ import annotations

import json
import signal
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from fairsched.config import ScheduleSpec, load_config
from fairsched.errors import ConfigError
from fairsched.store.schedules import due_times_between, enqueue_due, latest_due, next_due
from tests.supervisor_harness import fairsched, wait_until

WORKER = """
[[worker]]
name = "tick"
types = ["tick"]
handler = "sup_handlers:echo"
"""


def load(tmp_path, schedule: str):
    path = tmp_path / "workers.toml"
    path.write_text(WORKER + schedule)
    return load_config(path)


def refused(tmp_path, schedule: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, schedule)
    return str(info.value)


def test_a_schedule_is_read_with_its_job(tmp_path):
    config = load(tmp_path, '[[schedule]]\ntype = "tick"\ncron = "*/5 * * * *"\n'
                            'payload = { report = "daily" }\npriority = 3\n'
                            '[[schedule]]\nname = "tick-often"\ntype = "tick"\nevery = "30s"\n')
    assert config.schedules == (
        ScheduleSpec(name="tick", type="tick", cron="*/5 * * * *", every=None,
                     payload={"report": "daily"}, priority=3),
        ScheduleSpec(name="tick-often", type="tick", cron=None, every=30.0))


@pytest.mark.parametrize(("cron", "field"), [
    ("61 * * * *", "minute field (field 1): '61'"),
    ("0 25 * * *", "hour field (field 2): '25'"),
    ("0 0 32 * *", "day of month field (field 3): '32'"),
    ("0 0 * 13 *", "month field (field 4): '13'"),
    ("0 0 * * funday", "day of week field (field 5): 'funday'"),
])
def test_a_bad_cron_expression_names_its_field(tmp_path, cron, field):
    message = refused(tmp_path, f'[[schedule]]\ntype = "tick"\ncron = "{cron}"\n')
    assert message == f"{tmp_path / 'workers.toml'}: [[schedule]] 'tick' key 'cron' has a bad {field}"


def test_a_cron_expression_needs_five_fields(tmp_path):
    message = refused(tmp_path, '[[schedule]]\ntype = "tick"\ncron = "0 * * * * *"\n')
    assert "key 'cron' must have 5 fields (minute, hour, day of month, month, day of week)" \
           ", got 6" in message


@pytest.mark.parametrize("keys", ['cron = "0 * * * *"\nevery = "30s"', ""])
def test_a_schedule_needs_exactly_one_of_cron_or_every(tmp_path, keys):
    message = refused(tmp_path, f'[[schedule]]\ntype = "tick"\n{keys}\n')
    assert message.endswith("[[schedule]] 'tick' needs exactly one of 'cron' (such as "
                            "\"0 * * * *\") or 'every' (such as \"30s\")")


@pytest.mark.parametrize(("every", "problem"), [
    ('"soon"', "must be an age such as 30d, 12h, 45m or 90s, got 'soon'"),
    ('"0s"', "must be at least 1s, got '0s'"),
    ("true", "must be an age such as \"30d\" or a number of seconds, got boolean true"),
])
def test_a_bad_every_is_refused(tmp_path, every, problem):
    message = refused(tmp_path, f'[[schedule]]\ntype = "tick"\nevery = {every}\n')
    assert message.endswith(f"[[schedule]] 'tick' key 'every' {problem}")


@pytest.mark.parametrize(("keys", "problem"), [
    ('type = "no spaces"', "key 'type' has an"),
    ('type = "tick"\nevery = 60\npriority = 11', "key 'priority' must be <= 10, got 11"),
    ('type = "tick"\nevery = 60\npayload = "x"', "key 'payload' must be a table, got string"),
    ('type = "tick"\nevery = 60\ntenant = "a b"', "key 'tenant' has an invalid tenant 'a b'"),
])
def test_the_job_of_a_schedule_is_checked(tmp_path, keys, problem):
    assert problem in refused(tmp_path, f"[[schedule]]\n{keys}\n")


def test_two_schedules_of_one_type_need_names(tmp_path):
    message = refused(tmp_path, '[[schedule]]\ntype = "tick"\nevery = 60\n'
                                '[[schedule]]\ntype = "tick"\ncron = "0 * * * *"\n')
    assert message.endswith("[[schedule]] 'tick' key 'name' is a duplicate name (two schedules "
                            "of one type need a 'name' each)")


def test_due_times():
    at = datetime(2026, 3, 1, 10, 7, 30, tzinfo=UTC)
    hourly = ScheduleSpec("h", "tick", "0 * * * *", None)
    assert latest_due(hourly, at) == datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
    assert latest_due(hourly, at.replace(minute=0, second=0)) == at.replace(minute=0, second=0)
    assert next_due(hourly, at) == datetime(2026, 3, 1, 11, 0, tzinfo=UTC)
    every = ScheduleSpec("e", "tick", None, 45.0)
    assert latest_due(every, at) == datetime(2026, 3, 1, 10, 7, 30, tzinfo=UTC)
    assert next_due(every, at) == datetime(2026, 3, 1, 10, 8, 15, tzinfo=UTC)
    assert due_times_between(hourly, at - timedelta(hours=3), at) == [
        datetime(2026, 3, 1, h, 0, tzinfo=UTC) for h in (8, 9, 10)]
    assert due_times_between(every, at - timedelta(seconds=90), at) == [
        at - timedelta(seconds=45), at]


def scheduled_jobs(url: str) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT run_after, type, payload, priority FROM fairsched_jobs"
                            " ORDER BY id").fetchall()


def test_a_schedule_enqueues_its_jobs_for_its_tenant(tmp_path, db):
    config = load(tmp_path, '[[schedule]]\ntype = "tick"\nevery = 60\ntenant = "acme"\n')
    (spec,) = config.schedules
    assert spec.tenant == "acme"
    with psycopg.connect(db, autocommit=True) as conn:
        enqueue_due(conn, spec)  # its first check: the record starts
        conn.execute("UPDATE fairsched_schedules SET last_due = last_due - interval '1 minute'")
        assert len(enqueue_due(conn, spec)[1]) == 1
        assert conn.execute("SELECT tenant FROM fairsched_jobs").fetchall() == [("acme",)]


def test_racing_checks_enqueue_a_due_time_once(db):
    spec = ScheduleSpec("tick", "tick", None, 3600.0, {"n": 1}, 2)
    with psycopg.connect(db, autocommit=True) as conn:
        assert enqueue_due(conn, spec)[1] == []  # its first check: the record starts
        # As if the last due time enqueued were the one before this hour's.
        conn.execute("UPDATE fairsched_schedules SET last_due = last_due - interval '1 hour'")
    barrier = threading.Barrier(8)
    results = []

    def check():
        with psycopg.connect(db, autocommit=True) as conn:
            barrier.wait()
            results.append(enqueue_due(conn, spec)[1])

    threads = [threading.Thread(target=check) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    won = [r for r in results if r]
    assert len(results) == 8 and len(won) == 1 and len(won[0]) == 1, results
    jobs = scheduled_jobs(db)
    assert jobs == [(won[0][0].due, "tick", {"n": 1}, 2)]
    assert won[0][0].folded == 1


def test_times_missed_while_none_ran_are_enqueued_once(db):
    spec = ScheduleSpec("tick", "tick", None, 60.0)
    with psycopg.connect(db, autocommit=True) as conn:
        latest, done = enqueue_due(conn, spec)
        assert done == []
        conn.execute("UPDATE fairsched_schedules SET last_due = last_due - interval '10 min'")
        again, done = enqueue_due(conn, spec)
        assert again == latest and len(done) == 1 and done[0].folded == 10
        assert enqueue_due(conn, spec)[1] == []  # the same due time again: nothing
    assert [row[0] for row in scheduled_jobs(db)] == [latest]


def test_a_check_that_comes_late_enqueues_each_due_time_since_the_last_check(db):
    spec = ScheduleSpec("tick", "tick", None, 60.0)
    with psycopg.connect(db, autocommit=True) as conn:
        latest, _ = enqueue_due(conn, spec)
        # This supervisor's previous check found the due time 3 minutes back, and a minute
        # before that everything had been enqueued: it has run all along, only late.
        conn.execute("UPDATE fairsched_schedules SET last_due = last_due - interval '4 min'")
        _, done = enqueue_due(conn, spec, since=latest - timedelta(minutes=3))
    expected = [latest - timedelta(minutes=m) for m in (3, 2, 1, 0)]
    assert [(d.due, d.folded) for d in done] == [(t, 1) for t in expected]
    assert [row[0] for row in scheduled_jobs(db)] == expected


def test_a_supervisor_started_after_missed_times_enqueues_one_job(supervisors, db):
    schedule = '[[schedule]]\ntype = "tick"\nevery = "1h"\n'
    with psycopg.connect(db, autocommit=True) as conn:
        # Its last due time five hours back: four due times since went by with none running.
        conn.execute("INSERT INTO fairsched_schedules (name, last_due) VALUES"
                     " ('tick', date_trunc('hour', now()) - interval '4 hours')")
    sup = supervisors(WORKER + schedule).start()
    line = sup.wait_output(r"schedule tick: enqueued job (\d+) for \S+, once for 4 due times "
                           r"missed while no supervisor ran")
    jobs = scheduled_jobs(db)
    assert len(jobs) == 1 and jobs[0][1] == "tick", jobs
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT last_job FROM fairsched_schedules").fetchone()[0] \
               == int(line[1])


def test_three_supervisors_and_a_restart_enqueue_each_due_time_once(supervisors, db):
    workers = WORKER + '[[schedule]]\ntype = "tick"\nevery = "1s"\n'
    sups = [supervisors(workers).start(wait=False) for _ in range(3)]
    for sup in sups:
        sup.wait_for(lambda ps: all(s["state"] == "free" for s in ps["slots"]),
                     what="workers ready")

    def due_times() -> list[datetime]:
        return [row[0] for row in scheduled_jobs(db)]

    # Ten seconds of due times, the middle one's supervisor killed and started again.
    first = wait_until(due_times, 10, "the first scheduled job")[0]
    wait_until(lambda: any(d >= first + timedelta(seconds=4) for d in due_times()), 10,
               "4 s of scheduled jobs")
    sups[1].proc.send_signal(signal.SIGKILL)
    sups[1].proc.wait()
    wait_until(lambda: any(d >= first + timedelta(seconds=6) for d in due_times()), 10,
               "6 s of scheduled jobs")
    sups[1].start()
    wait_until(lambda: any(d >= first + timedelta(seconds=10) for d in due_times()), 10,
               "10 s of scheduled jobs")
    counts = Counter(due_times())
    last = max(counts)
    expected = [first + timedelta(seconds=s) for s in range(int((last - first).total_seconds()) + 1)]
    assert sorted(counts) == expected, "a due time is missing"
    assert set(counts.values()) == {1}, f"due times enqueued twice: {counts}"
    assert all(sup.proc.poll() is None for sup in sups)


def test_schedules_lists_next_and_last_times(supervisors, db):
    schedule = ('[[schedule]]\ntype = "tick"\ncron = "0 3 * * *"\npayload = { a = 1 }\n'
                '[[schedule]]\nname = "tick-often"\ntype = "tick"\nevery = "1s"\n')
    sup = supervisors(WORKER + schedule).start()
    job = int(sup.wait_output(r"schedule tick-often: enqueued job (\d+)")[1])
    result = sup.cli("schedules", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert set(rows) == {"tick", "tick-often"}
    daily = rows["tick"]
    assert (daily["type"], daily["cron"], daily["every"], daily["payload"]) == \
           ("tick", "0 3 * * *", None, {"a": 1})
    assert datetime.fromisoformat(daily["next"]).time().isoformat() == "03:00:00"
    assert daily["last"] is None and daily["last_job"] is None  # not yet due since it began
    often = rows["tick-often"]
    assert often["every"] == 1.0 and often["last_job"] >= job
    assert datetime.fromisoformat(often["next"]) > datetime.fromisoformat(often["last"])
    table = sup.cli("schedules")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["NAME", "TYPE", "WHEN", "NEXT", "LAST", "LAST", "JOB"]
    assert lines[1].split()[:7] == ["tick", "tick", "0", "3", "*", "*", "*"]
    assert lines[1].split()[-2:] == ["-", "-"]
    assert lines[2].split()[:4] == ["tick-often", "tick", "every", "1s"]


def test_schedules_without_any_says_so(tmp_path):
    (tmp_path / "workers.toml").write_text(WORKER)
    result = fairsched("schedules", "--config", str(tmp_path / "workers.toml"))
    assert result.returncode == 0
    assert result.stdout.splitlines() == ["NAME  TYPE  WHEN  NEXT  LAST  LAST JOB"]
    assert result.stderr.strip() == f"no [[schedule]] in {tmp_path / 'workers.toml'}"


def test_a_reload_takes_schedules_added_changed_and_removed(supervisors, db):
    sup = supervisors(WORKER).start()
    header = sup.config.read_text()
    sup.config.write_text(header + '[[schedule]]\ntype = "tick"\nevery = "1s"\n')
    added = sup.cli("reload")
    assert added.returncode == 0, added
    assert added.stdout.splitlines() == [
        "reloaded: unchanged: 1 group (tick)",
        "reloaded: schedules: tick added (from the next check)"]
    sup.wait_output(r"schedule tick: enqueued job \d+")
    assert {row[1] for row in scheduled_jobs(db)} == {"tick"}
    sup.config.write_text(header + '[[schedule]]\ntype = "tick"\nevery = "1h"\n'
                                   '[[schedule]]\nname = "other"\ntype = "tick"\nevery = "1h"\n')
    changed = sup.cli("reload")
    assert changed.returncode == 0, changed
    assert changed.stdout.splitlines()[-1] == \
        "reloaded: schedules: tick changed, other added (from the next check)"
    # The new schedule's first check starts its record: the lane runs the new list.
    wait_until(lambda: "other" in last_due_names(db), 10, "the schedule 'other' checked")
    sup.config.write_text(header)
    removed = sup.cli("reload")
    assert removed.stdout.splitlines()[-1] == \
        "reloaded: schedules: tick removed, other removed (from the next check)"


def last_due_names(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {name for (name,) in conn.execute("SELECT name FROM fairsched_schedules")}
