"""`fairsched simulate` with tenants: the noisy-neighbour trace, per-tenant waits and Jain's
fairness index for fairsched, fifo and strict priority side by side."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fairsched import core
from fairsched.config import load_config
from fairsched.sched import TraceError, report, traces
from fairsched.sched import simulate as sim
from tests.test_sched_simulate import check_replay


@pytest.fixture(params=["c", "py"])
def impl(request, monkeypatch):
    """Run the simulator on one core implementation."""
    ns = core.implementations()[request.param]
    assert ns is not None, "the compiled core did not load"
    for name in ("SlotPool", "plan_cycle", "score_candidates"):
        monkeypatch.setattr(core, name, getattr(ns, name))
    monkeypatch.setattr(core, "__impl__", ns.impl)
    return request.param


def small_flood(tmp_path):
    scenario = traces.noisy_neighbour(seconds=600.0, flood_at=100.0, flood_jobs=600,
                                      tenants=5)
    trace_path, workers_path = scenario.write(tmp_path)
    config = load_config(workers_path)
    type_ids = sim.type_ids_of(config)
    return traces.read_trace(trace_path, type_ids), sim.slot_layout(config, type_ids), config


def test_a_flood_delays_the_other_tenants_by_about_a_job_under_fairsched_only(tmp_path, impl):
    trace, slots, config = small_flood(tmp_path)
    assert trace.tenant_names[0] == "" and "flood" in trace.tenant_names
    alone = dict(zip(trace.tenant_names, sim.tenant_alone(trace, slots), strict=True))
    results = {p: sim.simulate(trace, slots, config.scoring, p) for p in sim.DEFAULT_POLICIES}
    for r in results.values():
        check_replay(trace, slots, r)
    stats = {p: {t.tenant: t for t in report.tenant_stats(trace, r)}
             for p, r in results.items()}
    others = [name for name in trace.tenant_names if name not in ("", "flood")]
    # The flood is 600 jobs of 0.8 s on 4 slots: two minutes of work.
    for p in ("fifo", "priority"):
        assert max(stats[p][t].wait_p99 for t in others) > 60.0
    assert max(stats["fairsched"][t].wait_p99 for t in others) < 5.0
    jain = {p: report.jain_index(list(s.values()), alone) for p, s in stats.items()}
    assert jain["fairsched"] > 0.9 > jain["fifo"] + 0.3, jain
    assert jain["priority"] == jain["fifo"]  # every job is priority 0


def test_simulate_reports_tenants_side_by_side(tmp_path):
    trace_path, workers_path = traces.noisy_neighbour(
        seconds=300.0, flood_at=50.0, flood_jobs=200, tenants=3).write(tmp_path)
    result = subprocess.run([sys.executable, "-m", "fairsched", "simulate", str(trace_path),
                             "--workers", str(workers_path)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    head = lines.index(next(line for line in lines if line.startswith("TENANT")))
    assert lines[head].split() == ["TENANT", "JOBS", "fairsched", "p50/p99", "fifo", "p50/p99",
                                   "priority", "p50/p99"]
    assert any(line.startswith("flood ") for line in lines[head:])
    assert lines[-1].startswith("Jain's index")
    data = json.loads(subprocess.run(
        [sys.executable, "-m", "fairsched", "simulate", str(trace_path), "--workers",
         str(workers_path), "--json"], capture_output=True, text=True, timeout=120).stdout)
    fair = data["policies"]["fairsched"]
    assert {t["tenant"] for t in fair["tenants"]} == {"flood", "t00", "t01", "t02"}
    assert 0 < data["policies"]["fifo"]["jain_index"] < fair["jain_index"] <= 1


def test_a_trace_without_tenants_reports_none(tmp_path):
    trace_path, workers_path = traces.starvation(flood_seconds=60.0).write(tmp_path)
    result = subprocess.run([sys.executable, "-m", "fairsched", "simulate", str(trace_path),
                             "--workers", str(workers_path), "--json"], capture_output=True,
                            text=True, timeout=120)
    assert "tenants" not in json.loads(result.stdout)["policies"]["fairsched"]


def test_a_bad_tenant_in_a_trace_names_its_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"at": 0, "type": "pdf", "duration": 1, "tenant": "a b"}\n')
    with pytest.raises(TraceError, match=r"t.jsonl line 1: 'tenant' is an invalid tenant 'a b'"):
        traces.read_trace(path, {"pdf": 0})
