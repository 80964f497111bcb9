"""`fairsched simulate`'s numbers on traces small enough to replay by hand: the waits per
(type, priority, on-demand), their p50/p99/max, makespan, throughput and stranded counts are
worked out in each test from the trace, not from the simulator."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

ONE_PDF_SLOT = '[[worker]]\nname = "pdf"\ntypes = ["pdf"]\nhandler = "m:f"\n'
# Two slots whose types overlap without nesting: [a, b] (slot 0) and [a, c] (slot 1).
OVERLAPPING = ('[[worker]]\nname = "ab"\ntypes = ["a", "b"]\nhandler = "m:f"\n\n'
               '[[worker]]\nname = "ac"\ntypes = ["a", "c"]\nhandler = "m:f"\n')


def replay(tmp_path, workers: str, jobs: list[dict], *policies: str) -> dict:
    (tmp_path / "workers.toml").write_text(workers)
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(j) + "\n" for j in jobs))
    args = [a for p in policies for a in ("--policy", p)]
    result = subprocess.run([sys.executable, "-m", "fairsched", "simulate", "t.jsonl", "--json",
                             *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["policies"]


def groups(policy: dict) -> dict:
    return {(g["type"], g["priority"], g["on_demand"]):
            (g["count"], g["wait_p50"], g["wait_p99"], g["wait_max"], g["stranded"])
            for g in policy["groups"]}


def test_waits_on_one_slot_under_each_policy(tmp_path):
    # A long job holds the slot until 200. Behind it: a priority-0 job from 1 and a
    # priority-1 job from 100. At 200 the first has 199 s x 16 = 3184 points, the second
    # 1024 + 100 s x 16 = 2624: fairsched, like fifo, runs the older one first; strict
    # priority the priority-1 job.
    jobs = [{"at": 0, "type": "pdf", "duration": 200},
            {"at": 1, "type": "pdf", "priority": 0, "duration": 5},
            {"at": 100, "type": "pdf", "priority": 1, "duration": 1}]
    out = replay(tmp_path, ONE_PDF_SLOT, jobs, "fifo", "priority", "fairsched")
    # fifo and fairsched: 0 at 0 (wait 0), 1 at 200 (199), 2 at 205 (105); ends at 206.
    for name in ("fifo", "fairsched"):
        assert groups(out[name]) == {("pdf", 0, False): (2, 0.0, 199.0, 199.0, 0),
                                     ("pdf", 1, False): (1, 105.0, 105.0, 105.0, 0)}, name
    # priority: 2 at 200 (100), 1 at 201 (200); ends at 206.
    assert groups(out["priority"]) == {("pdf", 0, False): (2, 0.0, 200.0, 200.0, 0),
                                       ("pdf", 1, False): (1, 100.0, 100.0, 100.0, 0)}
    for policy in out.values():
        assert (policy["makespan"], policy["throughput"]) == (206.0, 3 / 206.0)
        assert (policy["stranded"], policy["cycles"], policy["events"]) == (0, 3, 6)


def test_an_on_demand_job_goes_first_under_fairsched_only(tmp_path):
    # At 100 the queued job (from 1) has 99 x 16 = 1584 points, the on-demand one (from 50)
    # 4096 + 50 x (16 + 32) = 6496: fairsched runs it first; fifo and priority ignore the flag.
    jobs = [{"at": 0, "type": "pdf", "duration": 100},
            {"at": 1, "type": "pdf", "duration": 10},
            {"at": 50, "type": "pdf", "on_demand": True, "duration": 1}]
    out = replay(tmp_path, ONE_PDF_SLOT, jobs, "fairsched", "fifo", "priority")
    assert groups(out["fairsched"]) == {("pdf", 0, False): (2, 0.0, 100.0, 100.0, 0),
                                        ("pdf", 0, True): (1, 50.0, 50.0, 50.0, 0)}
    for name in ("fifo", "priority"):
        assert groups(out[name]) == {("pdf", 0, False): (2, 0.0, 99.0, 99.0, 0),
                                     ("pdf", 0, True): (1, 60.0, 60.0, 60.0, 0)}, name
    assert {p["makespan"] for p in out.values()} == {111.0}


def test_nearest_rank_percentiles_of_a_hundred_waits(tmp_path):
    # 100 one-second jobs at 0 on one slot wait 0, 1, ..., 99 s: nearest rank puts p50 on
    # the 50th (49 s) and p99 on the 99th (98 s).
    jobs = [{"at": 0, "type": "pdf", "duration": 1}] * 100
    for name, policy in replay(tmp_path, ONE_PDF_SLOT, jobs, "fifo", "fairsched").items():
        assert groups(policy) == {("pdf", 0, False): (100, 49.0, 98.0, 99.0, 0)}, name
        assert (policy["makespan"], policy["throughput"]) == (100.0, 1.0)


@pytest.mark.parametrize("policy", ["fifo", "priority", "fairsched"])
def test_a_job_stranded_by_the_slot_another_took_is_counted_once(tmp_path, policy):
    # At 0 an a job (priority 1: ahead under every policy, 1024 + 250 points against the b
    # job's 500) and a b job arrive at slots [a, b] and [a, c]. The a job takes [a, b]
    # (as specialised, lower id) and the b job, which only [a, b] runs, waits: stranded
    # once, as a on [a, c] would have placed both. At 5 another b job arrives while [a, b]
    # is busy and [a, c] free: it waits for a busy slot, which is not stranding. At 10 the
    # first b job runs (wait 10), at 13 the second (wait 8); all done at 16.
    jobs = [{"at": 0, "type": "a", "priority": 1, "duration": 10},
            {"at": 0, "type": "b", "duration": 3},
            {"at": 5, "type": "b", "duration": 3}]
    out = replay(tmp_path, OVERLAPPING, jobs, policy, "optimal")
    assert groups(out[policy]) == {("a", 1, False): (1, 0.0, 0.0, 0.0, 0),
                                   ("b", 0, False): (2, 8.0, 10.0, 10.0, 1)}
    assert (out[policy]["stranded"], out[policy]["makespan"]) == (1, 16.0)
    # The optimal matching puts a on [a, c]: b runs at once, the second b at 5; done at 10.
    assert groups(out["optimal"]) == {("a", 1, False): (1, 0.0, 0.0, 0.0, 0),
                                      ("b", 0, False): (2, 0.0, 0.0, 0.0, 0)}
    assert (out["optimal"]["stranded"], out["optimal"]["makespan"]) == (0, 10.0)
    assert out["optimal"]["throughput"] == 3 / 10.0


def test_with_a_tick_jobs_start_on_the_next_tick(tmp_path):
    # --tick 5: nothing starts before 5. Job 0 (from 1) runs 5..7, job 1 (from 2) waits for
    # the tick at 10 and runs 10..11: waits 4 and 8, makespan 11 - 1.
    (tmp_path / "workers.toml").write_text(ONE_PDF_SLOT)
    (tmp_path / "t.jsonl").write_text('{"at": 1, "type": "pdf", "duration": 2}\n'
                                      '{"at": 2, "type": "pdf", "duration": 1}\n')
    result = subprocess.run([sys.executable, "-m", "fairsched", "simulate", "t.jsonl", "--json",
                             "--tick", "5"], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for name, policy in json.loads(result.stdout)["policies"].items():
        assert groups(policy) == {("pdf", 0, False): (2, 4.0, 8.0, 8.0, 0)}, name
        assert (policy["makespan"], policy["cycles"]) == (10.0, 2), name
