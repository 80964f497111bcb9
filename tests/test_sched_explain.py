"""`fairsched explain`: the weights in time, and a pending job's score by component."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import psycopg
import pytest

from fairsched import core
from fairsched.config import load_config
from fairsched.sched import explain as ex
from fairsched.store.errors import JobNotFound
from fairsched.store.queue import Queue

W = core.Weights()


def fairsched(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "fairsched", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env=env)


# -- the weights in time ------------------------------------------------------------------------

def test_priority_crossovers_are_gap_times_wp_over_wa():
    table = dict(ex.priority_crossovers(W))
    assert list(table) == list(range(1, 11))
    assert table[5] == 320.0
    assert all(table[g] == g * 64.0 for g in table)
    assert dict(ex.priority_crossovers(core.Weights(age=32.0)))[5] == 160.0


def test_on_demand_crossover_and_rarity_bonuses():
    assert ex.on_demand_crossover(W) == 256.0
    bonuses = dict(ex.rarity_bonuses(W))
    assert [bonuses[n] for n in (1, 2, 4, 8)] == [500.0, 250.0, 125.0, 62.5]
    assert ex.on_demand_crossover(core.Weights(age=0.0)) == float("inf")


def test_the_crossovers_are_where_the_core_changes_its_order():
    # A queued priority-0 job against a fresh on-demand job, both of one type (same rarity).
    def first(age_of_queued):
        cands = core.Candidates.from_lists([0, 0], [0, 0], [100.0 - age_of_queued, 100.0],
                                           [False, True], [1, 2])
        return core.score_candidates(cands, 100.0, [2], W)[1][0]

    assert first(255.0) == 1 and first(257.0) == 0
    # A priority-0 job against a fresh priority-5 job: 320 s.
    cands = core.Candidates.from_lists([0, 0], [0, 5], [100.0 - 321.0, 100.0], [False, False],
                                       [1, 2])
    assert core.score_candidates(cands, 100.0, [1], W)[1][0] == 0


@pytest.mark.parametrize(("priority", "age", "free", "on_demand"),
                         [(3, 95.0, 2, False), (0, 10.0, 1, True), (10, 0.0, 0, False),
                          (3, 95.1234567, 2, False), (7, 0.3, 3, True)])
def test_breakdown_components_add_up_to_the_core_score(priority, age, free, on_demand):
    b = ex.score_breakdown(W, priority=priority, age=age, free_slots=free, on_demand=on_demand)
    assert b.priority_points == priority * 1024
    assert b.age_points == age * 16
    assert b.rarity_points == (500 / free if free else 0.0)
    assert b.on_demand_points == (4096 + 32 * age if on_demand else 0.0)
    # Exactly: the age reaches the core as given, so --json's total is its parts' sum.
    assert b.total == (b.priority_points + b.age_points + b.rarity_points
                       + b.on_demand_points)


def test_weights_report_shows_the_tables():
    text = ex.weights_report(W, "defaults")
    assert "    5  320 s (5.3 min)" in text
    assert "B_od / W_a = 256 s" in text
    assert "     8      62.5" in text
    assert "p + B_od / W_p = p + 4" in text
    assert "  W_t / W_a = 1024 s (17.1 min)" in text


def test_fractional_and_extreme_weights_read_as_given():
    text = ex.weights_report(core.Weights(priority=1.5, age=0.004, rarity=0.001, on_demand=0.5,
                                          on_demand_age=0.0), "test")
    assert "W_a  =    0.004" in text and "W_r  =    0.001" in text
    assert "    1  375 s (6.2 min)" in text  # 1.5 / 0.004
    text = ex.weights_report(core.Weights(priority=1e300, age=1e-300, rarity=1, on_demand=1,
                                          on_demand_age=0), "test")
    assert "W_p  =   1e+300" in text
    assert "never (age_weight is 0, or too small to count)" in text


# -- one job from the job table -----------------------------------------------------------------

def write_config(tmp_path, url, scoring=""):
    path = tmp_path / "workers.toml"
    path.write_text(textwrap.dedent(f"""
        [supervisor]
        state_dir = "state"
        database = "{url}"

        [scoring]
        {scoring}

        [[worker]]
        name = "pdf"
        types = ["pdf"]
        handler = "h:pdf"
        processes = 3

        [[worker]]
        name = "office"
        types = ["pdf", "index"]
        handler = "h:office"
    """))
    return path


def enqueue(url, type_name, priority, waited):
    with psycopg.connect(url, autocommit=True) as conn:
        job_id = Queue(conn).enqueue(type_name, priority=priority)
        conn.execute("UPDATE fairsched_jobs SET run_after = now() - %s * interval '1 second'"
                     " WHERE id = %s", (waited, job_id))
    return job_id


@pytest.fixture
def no_env_database(monkeypatch):
    monkeypatch.delenv("FAIRSCHED_DATABASE_URL", raising=False)


def test_explain_job_breaks_down_a_pending_job(db, tmp_path, no_env_database):
    config = load_config(write_config(tmp_path, db))
    job_id = enqueue(db, "pdf", 3, 100.0)
    explained = ex.explain_job(config, job_id)
    b = explained.breakdown
    assert explained.type == "pdf" and explained.status == "pending"
    assert b.priority_points == 3072.0
    assert 100.0 <= b.age < 110.0 and b.age_points == b.age * 16
    # No supervisor runs: the 4 configured pdf slots count as free.
    assert b.free_slots == 4 and b.rarity_points == 125.0
    assert "no supervisor reachable" in explained.free_source
    assert b.on_demand_points == 0.0
    assert b.total == pytest.approx(3072.0 + b.age * 16 + 125.0)
    text = ex.job_report(explained, config.scoring)
    assert f"job {job_id}: type pdf, priority 3, pending" in text
    assert "500 / 4 free compatible slots" in text and "125.0" in text


def test_explain_job_unknown_or_not_pending(db, tmp_path, no_env_database):
    config = load_config(write_config(tmp_path, db))
    with pytest.raises(JobNotFound, match="no job with id 999"):
        ex.explain_job(config, 999)
    job_id = enqueue(db, "index", 0, 0.0)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("UPDATE fairsched_jobs SET status = 'cancelled' WHERE id = %s", (job_id,))
    with pytest.raises(ex.JobNotPending, match=f"job {job_id} is cancelled"):
        ex.explain_job(config, job_id)


def test_explain_job_uses_the_running_supervisors_free_slots(db, tmp_path, monkeypatch):
    from tests.supervisor_harness import Supervisor

    sup = Supervisor(db, """
        [[worker]]
        name = "pdf"
        types = ["pdf"]
        handler = "sup_handlers:slow"
        processes = 2
    """)
    try:
        sup.start()
        # A delayed job stays pending while the supervisor runs: it has no score yet.
        waiting = int(sup.cli("submit", "pdf", "--delay", "3600").stdout)
        busy = int(sup.cli("submit", "pdf", "--payload", '{"seconds": 30}').stdout)
        sup.wait_for(lambda ps: any(s["job_id"] == busy for s in ps["slots"]), what="job running")
        monkeypatch.setenv("FAIRSCHED_DATABASE_URL", db)
        explained = ex.explain_job(load_config(sup.config), waiting)
        assert explained.breakdown.free_slots == 1
        assert explained.breakdown.rarity_points == 500.0
        assert explained.eligible_in > 3500 and explained.breakdown.age == 0.0
        assert "running supervisor" in explained.free_source
    finally:
        sup.close()


# -- the command --------------------------------------------------------------------------------

def test_explain_command_prints_the_defaults_without_a_config(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FAIRSCHED_CONFIG"}
    result = fairsched("explain", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert "defaults: no ./workers.toml" in result.stdout
    assert "    5  320 s" in result.stdout
    # Its prose fits an 80-column terminal, as its tables do.
    assert max(map(len, result.stdout.splitlines())) <= 80, result.stdout


def test_explain_command_names_where_the_weights_come_from(tmp_path):
    path = write_config(tmp_path, "postgresql://unused", scoring="age_weight = 32")
    assert f"([scoring] of {path})" in fairsched("explain", "--config", str(path)).stdout
    path.write_text(path.read_text().replace("[scoring]", "").replace("age_weight = 32", ""))
    result = fairsched("explain", "--config", str(path))
    assert f"(defaults: {path} has no [scoring])" in result.stdout, result.stdout


def test_explain_command_json_follows_the_config(tmp_path):
    path = write_config(tmp_path, "postgresql://unused", scoring="age_weight = 32")
    result = fairsched("explain", "--config", str(path), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["weights"]["age_weight"] == 32.0
    assert {"gap": 5, "seconds": 160.0} in data["priority_crossovers"]
    assert data["on_demand_crossover"] == 128.0
    assert [r["points"] for r in data["rarity_bonuses"]][:2] == [500.0, 250.0]


def test_explain_command_job(db, tmp_path, no_env_database):
    path = write_config(tmp_path, db)
    job_id = enqueue(db, "index", 2, 50.0)
    result = fairsched("explain", "--config", str(path), "--job", str(job_id), "--json")
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)["job"]
    assert job["breakdown"]["rarity_points"] == 500.0  # one configured index slot
    assert job["breakdown"]["priority_points"] == 2048.0

    result = fairsched("explain", "--config", str(path), "--job", "424242")
    assert result.returncode == 1
    assert result.stderr.strip() == "fairsched: no job with id 424242"


def test_explain_job_on_a_host_that_only_queues_work(db, tmp_path):
    """With FAIRSCHED_DATABASE_URL and no workers.toml, `jobs` and `submit` use that database;
    `explain --job` does too (default weights, free slots not counted), where it refused."""
    job_id = enqueue(db, "pdf", 3, 10.0)
    env = {k: v for k, v in os.environ.items() if k != "FAIRSCHED_CONFIG"}
    env["FAIRSCHED_DATABASE_URL"] = db
    result = fairsched("explain", "--job", str(job_id), cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"job {job_id}: type pdf, priority 3, pending, waiting 1"), lines
    assert "  priority       3072.0  3 x 1024" in lines, lines
    assert lines[-1] == "  free slots: not counted (no ./workers.toml here; the default weights)"
    result = fairsched("explain", "--job", "424242", cwd=tmp_path, env=env)
    assert (result.returncode, result.stderr) == (1, "fairsched: no job with id 424242\n")
    assert not (tmp_path / ".fairsched").exists()  # no embedded database started here


@pytest.mark.parametrize("args", [["--job", "abc"], ["--job", "0"]])
def test_explain_command_bad_usage_exits_2(tmp_path, args):
    path = write_config(tmp_path, "postgresql://unused")
    result = fairsched("explain", "--config", str(path), *args)
    assert result.returncode == 2
    assert result.stderr == ("fairsched: --job must be an integer from 1 to 9223372036854775807, "
                             f"got '{args[1]}'\n"), result.stderr


def test_explain_command_bad_config_exits_2(tmp_path):
    path = tmp_path / "workers.toml"
    path.write_text("[scoring]\nage_weight = -1\n")
    result = fairsched("explain", "--config", str(path))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "age_weight" in result.stderr


def test_a_delayed_job_is_said_to_be_no_candidate_yet():
    b = ex.score_breakdown(W, priority=0, age=0.0, free_slots=2, on_demand=False)
    text = ex.job_report(ex.JobExplanation(7, "pdf", "pending", 71.2, b, "test"), W)
    assert text.splitlines()[:2] == [
        "job 7: type pdf, priority 0, pending, eligible in 71 s",
        "  no candidate until then: the score below is the one it starts with"]
    assert max(map(len, text.splitlines())) <= 80, text


@pytest.mark.parametrize(("eligible_in", "said"), [(9.96, "10 s"), (4.26, "4.3 s"),
                                                  (0.4, "0.4 s"), (0.02, "less than 0.1 s")])
def test_a_job_delayed_by_seconds_or_less_says_how_long_in_tenths(eligible_in, said):
    b = ex.score_breakdown(W, priority=0, age=0.0, free_slots=2, on_demand=False)
    text = ex.job_report(ex.JobExplanation(7, "pdf", "pending", eligible_in, b, "test"), W)
    assert text.splitlines()[0] == f"job 7: type pdf, priority 0, pending, eligible in {said}"


def test_explain_command_job_delayed_by_a_few_seconds(db, tmp_path, no_env_database):
    path = write_config(tmp_path, db)
    job_id = enqueue(db, "pdf", 0, -3.0)  # eligible 3 s from now
    result = fairsched("explain", "--config", str(path), "--job", str(job_id))
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert re.fullmatch(rf"job {job_id}: type pdf, priority 0, pending, eligible in [0-2]\.\d s",
                        first), first


def test_explain_command_job_of_a_type_with_control_characters(db, tmp_path, no_env_database):
    # The table holds any type a producer wrote: the report stays its own lines, and an
    # escape sequence in the type reaches the terminal spelled out.
    path = write_config(tmp_path, db)
    with psycopg.connect(db, autocommit=True) as conn:  # as SQL of one's own or an older
        # version wrote it: enqueue takes valid type names only
        (job_id,) = conn.execute("INSERT INTO fairsched_jobs (type, run_after) VALUES "
                                 "(%s, now() - interval '5 s') RETURNING id",
                                 ("new\nline\x1b[2J",)).fetchone()
    result = fairsched("explain", "--config", str(path), "--job", str(job_id))
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith(f"job {job_id}: type new\\nline\\x1b[2J, priority 0, pending"), first
    assert "\x1b" not in result.stdout


def test_explain_command_job_table_shows_small_and_huge_weights_points(db, tmp_path,
                                                                       no_env_database):
    # With weights of a few hundredths every component read 0.0 beside a total of 0.1; with
    # 1e12 they overflowed the column.
    path = write_config(tmp_path, db, scoring="priority_weight = 0.01\nage_weight = 0.001\n"
                                              "rarity_weight = 0.03")
    job_id = enqueue(db, "index", 3, 40.0)  # one configured index slot, counted as free
    lines = fairsched("explain", "--config", str(path), "--job", str(job_id)).stdout.splitlines()
    assert "  priority         0.03  3 x 0.01" in lines, lines
    assert "  rarity           0.03  0.03 / 1 free compatible slots" in lines, lines
    age_row = next(line for line in lines if line.startswith("  age "))
    age_points = float(age_row.split()[1])
    assert 0.04 <= age_points < 0.06, lines  # 40-odd s x 0.001
    total = float(next(line for line in lines if line.startswith("  total ")).split()[1])
    assert total == pytest.approx(0.03 + age_points + 0.03, abs=0.0011), lines

    path = write_config(tmp_path, db, scoring="priority_weight = 1e12\nage_weight = 1e3\n"
                                              "rarity_weight = 1e12")
    lines = fairsched("explain", "--config", str(path), "--job", str(job_id)).stdout.splitlines()
    assert "  priority        3e+12  3 x 1e+12" in lines, lines
    assert "  rarity          1e+12  1e+12 / 1 free compatible slots" in lines, lines
    assert "  total           4e+12" in lines, lines


def test_explain_job_shows_the_tenant_term(db, tmp_path):
    """A job of the tenant that used the slots most loses tenant_weight x its share above the
    lightest waiting tenant's; the total is still the core's score."""
    from fairsched.store.queue import Queue

    with psycopg.connect(db, autocommit=True) as conn:
        heavy = Queue(conn).enqueue("pdf", tenant="heavy")
        Queue(conn).enqueue("pdf", tenant="light")
        conn.execute("INSERT INTO fairsched_tenant_usage VALUES ('heavy', 30, now()),"
                     " ('light', 10, now())")
    path = write_config(tmp_path, db)
    explained = ex.explain_job(load_config(path), heavy)
    b = explained.breakdown
    assert b.tenant == "heavy"
    assert b.tenant_share == pytest.approx(0.5, abs=1e-3)  # 0.75 - 0.25
    assert b.tenant_points == pytest.approx(-0.5 * W.tenant, abs=W.tenant / 1000)
    assert b.total == pytest.approx(b.priority_points + b.age_points + b.rarity_points
                                    + b.tenant_points)
    text = ex.job_report(explained, W)
    assert "  tenant: heavy" in text.splitlines()
    assert any(line.split()[0] == "tenant" and float(line.split()[1]) < -8000
               and f"-{W.tenant:.0f} x 0.5" in line for line in text.splitlines()), text
