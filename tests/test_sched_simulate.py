"""`fairsched simulate`: trace replay on the real core, the starvation bound, stranded jobs."""

from __future__ import annotations

import heapq
import json
import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fairsched import core
from fairsched.config import load_config
from fairsched.sched import TraceError, report, traces
from fairsched.sched import simulate as sim


def fairsched(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "fairsched", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


@pytest.fixture(params=["c", "py"])
def impl(request, monkeypatch):
    """Run the simulator on one core implementation (the live one is the compiled one)."""
    ns = core.implementations()[request.param]
    assert ns is not None, "the compiled core did not load"
    for name in ("SlotPool", "plan_cycle", "score_candidates"):
        monkeypatch.setattr(core, name, getattr(ns, name))
    monkeypatch.setattr(core, "__impl__", ns.impl)
    return request.param


def load(scenario, tmp_path):
    trace_path, workers_path = scenario.write(tmp_path)
    config = load_config(workers_path)
    type_ids = sim.type_ids_of(config)
    return traces.read_trace(trace_path, type_ids), sim.slot_layout(config, type_ids), config


def check_replay(trace, slots, result):
    """Every job ran once, after it arrived, on a slot of its type, one job at a time per slot."""
    assert result.events == 2 * len(trace)
    per_slot = {}
    for j in range(len(trace)):
        start, sid = result.starts[j], result.slots[j]
        assert start >= trace.at[j]
        assert trace.types[j] in slots[sid]
        per_slot.setdefault(sid, []).append((start, start + trace.durations[j]))
    for runs in per_slot.values():
        runs.sort()
        assert all(a[1] <= b[0] for a, b in zip(runs, runs[1:], strict=False))
    assert result.makespan == pytest.approx(
        max(s + d for s, d in zip(result.starts, trace.durations, strict=True)) - trace.at[0])


# -- anti-starvation -----------------------------------------------------------------------------

def test_the_rare_job_waits_bounded_under_fairsched_and_starves_under_priority(tmp_path, impl):
    scenario = traces.starvation(flood_seconds=1800.0, duration=10.0, rare_at=65.0)
    trace, slots, config = load(scenario, tmp_path)
    rare = trace.type_names.index("index")
    (j,) = [j for j in range(len(trace)) if trace.types[j] == rare]
    waits = {}
    for policy in sim.POLICIES:
        result = sim.simulate(trace, slots, config.scoring, policy)
        check_replay(trace, slots, result)
        waits[policy] = result.starts[j] - trace.at[j]
    w = config.scoring
    # A priority-0 job overtakes fresh priority-5 jobs after 5 x W_p / W_a = 320 s; it may
    # then wait for the next slot to free up, at most one job duration.
    bound = 5 * w.priority / w.age + 10.0
    assert waits["fairsched"] <= bound
    assert waits["optimal"] <= bound
    # Strict priority serves the flood first: the rare job starts only when the flood ends.
    assert waits["priority"] >= 1800.0 - 65.0
    assert waits["priority"] > 5 * waits["fairsched"]
    assert waits["fifo"] <= 10.0


def test_on_demand_jobs_go_first_without_starving_the_queue(tmp_path):
    trace, slots, config = load(traces.on_demand_burst(), tmp_path)
    results = {p: sim.simulate(trace, slots, config.scoring, p) for p in ("fairsched", "fifo")}

    def median_wait(result, on_demand):
        waits = sorted(result.starts[j] - trace.at[j] for j in range(len(trace))
                       if trace.on_demand[j] == on_demand)
        return report.percentile(waits, 50)

    assert median_wait(results["fairsched"], True) < median_wait(results["fifo"], True)
    check_replay(trace, slots, results["fairsched"])


def test_both_core_implementations_replay_identically(tmp_path):
    trace, slots, config = load(traces.office_day(hours=2, seed=7), tmp_path)
    runs = {}
    for name in ("c", "py"):
        ns = core.implementations()[name]
        assert ns is not None, "the compiled core did not load"
        saved = core.SlotPool, core.plan_cycle, core.score_candidates
        core.SlotPool, core.plan_cycle, core.score_candidates = (
            ns.SlotPool, ns.plan_cycle, ns.score_candidates)
        try:
            result = sim.simulate(trace, slots, config.scoring, "fairsched", tick=2.0)
        finally:
            core.SlotPool, core.plan_cycle, core.score_candidates = saved
        runs[name] = (result.starts, result.slots, result.stranded)
    assert runs["c"] == runs["py"]


# -- stranded jobs and optimal matching ---------------------------------------------------------

STRAND_WORKERS = """
[[worker]]
name = "ab"
types = ["a", "b"]
handler = "simulated:job"

[[worker]]
name = "ac"
types = ["a", "c"]
handler = "simulated:job"
"""


def test_greedy_strands_a_job_in_a_cycle_and_optimal_does_not(tmp_path):
    (tmp_path / "w.toml").write_text(STRAND_WORKERS)
    # Both arrive at once: the a job (priority 5) outranks the b job and takes [a,b]
    # (as specialised as [a,c], lower id); the b job waits while [a,c] stays free.
    (tmp_path / "t.jsonl").write_text(
        '{"at": 0, "type": "a", "priority": 5, "duration": 30}\n'
        '{"at": 0, "type": "b", "priority": 0, "duration": 5}\n')
    config = load_config(tmp_path / "w.toml")
    ids = sim.type_ids_of(config)
    trace = traces.read_trace(tmp_path / "t.jsonl", ids)
    slots = sim.slot_layout(config, ids)
    greedy = sim.simulate(trace, slots, config.scoring, "fairsched")
    optimal = sim.simulate(trace, slots, config.scoring, "optimal")
    assert greedy.stranded == [0, 1] and greedy.starts == [0.0, 30.0]
    assert optimal.stranded == [0, 0] and optimal.starts == [0.0, 0.0]
    check_replay(trace, slots, greedy)
    check_replay(trace, slots, optimal)
    stats = {g.type: g for g in report.group_stats(trace, greedy)}
    assert stats["b"].stranded == 1 and stats["b"].wait_max == 30.0


def test_the_fairsched_policy_plans_as_the_configs_matching_says(tmp_path):
    (tmp_path / "w.toml").write_text('[scoring]\nmatching = "optimal"\n' + STRAND_WORKERS)
    (tmp_path / "t.jsonl").write_text(
        '{"at": 0, "type": "a", "priority": 5, "duration": 30}\n'
        '{"at": 0, "type": "b", "priority": 0, "duration": 5}\n')
    result = fairsched("simulate", str(tmp_path / "t.jsonl"), "--workers", str(tmp_path / "w.toml"),
                       "--policy", "fairsched", "--json")
    assert result.returncode == 0, result.stderr
    groups = json.loads(result.stdout)["policies"]["fairsched"]["groups"]
    assert {g["type"]: g["wait_max"] for g in groups} == {"a": 0.0, "b": 0.0}


def test_optimal_never_strands_a_job_on_an_office_day(tmp_path):
    trace, slots, config = load(traces.office_day(hours=3, seed=5), tmp_path)
    for tick in (0.0, 5.0):
        greedy = sim.simulate(trace, slots, config.scoring, "fairsched", tick)
        optimal = sim.simulate(trace, slots, config.scoring, "optimal", tick)
        check_replay(trace, slots, greedy)
        check_replay(trace, slots, optimal)
        assert sum(optimal.stranded) == 0


def test_tick_batches_events_into_cycles(tmp_path):
    trace, slots, config = load(traces.office_day(hours=1, seed=3), tmp_path)
    every_event = sim.simulate(trace, slots, config.scoring, "fifo")
    ticked = sim.simulate(trace, slots, config.scoring, "fifo", tick=10.0)
    check_replay(trace, slots, ticked)
    assert all(s % 10.0 == 0 for s in ticked.starts)
    assert ticked.cycles < every_event.cycles


# -- the trace format ---------------------------------------------------------------------------

def test_trace_is_read_in_arrival_order_keeping_file_order_for_ties(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"at": 5, "type": "b", "duration": 1}\n\n'
                    '{"at": 1, "type": "a", "duration": 2, "priority": 3, "on_demand": true}\n'
                    '{"at": 5, "type": "a", "duration": 0}\n')
    trace = traces.read_trace(path, {"a": 0, "b": 1})
    assert trace.at == [1.0, 5.0, 5.0]
    assert trace.types == [0, 1, 0] and trace.line == [3, 1, 4]
    assert trace.priorities == [3, 0, 0] and trace.on_demand == [True, False, False]


BAD_LINES = [
    ('{"at": 1, "type": "a"', "line 2: not valid JSON"),
    ('[1, 2]', "line 2: must be a JSON object, got an array"),
    ('null', "line 2: must be a JSON object, got null"),
    ('[' * 100000 + ']' * 100000, "line 2: nests too deeply to be a job"),
    ('{"at": 1, "type": "a", "duration": 1, "prio": 2}', "line 2: unknown key 'prio'"),
    ('{"type": "a", "duration": 1}', "line 2: 'at' is missing"),
    ('{"at": 1, "type": "a", "duration": 1, "at": 5}', "line 2: key 'at' is given twice"),
    ('{"at": 1, "type": "a", "priority": 1, "duration": 1, "priority": 9}',
     "line 2: key 'priority' is given twice"),
    ('{"at": -1, "type": "a", "duration": 1}', r"line 2: 'at' must be a number of seconds from 0 "
                                               r"to 1e\+09, got -1.0"),
    ('{"at": 1e300, "type": "a", "duration": 1}', "line 2: 'at' must be a number of seconds"),
    ('{"at": 1, "type": "a", "duration": 1e308}', r"line 2: 'duration' must be a number of "
                                                  r"seconds from 0 to 1e\+09"),
    ('{"at": 1, "type": "a", "duration": "long"}', "line 2: 'duration' must be a number"),
    ('{"at": 1, "type": "z", "duration": 1}', "line 2: no worker handles type 'z'"),
    ('{"at": 1, "type": "a", "duration": 1, "priority": 11}', "line 2: 'priority' must be an "
                                                               "integer from 0 to 10"),
    ('{"at": 1, "type": "a", "duration": 1, "on_demand": 1}', "line 2: 'on_demand' must be "
                                                               "true or false"),
    ('{"at": 1' + "0" * 400 + ', "type": "a", "duration": 1}',
     r"line 2: 'at' must be a number of seconds from 0 to 1e\+09, got inf"),
    ('{"at": 1, "type": "a", "duration": 1, "priority": 9' + "9" * 5000 + "}",
     # Python's own words advised sys.set_int_max_str_digits().
     "line 2: an integer of 5001 digits, where numbers take at most 4300$"),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES)
def test_a_bad_trace_line_is_named(tmp_path, line, message):
    path = tmp_path / "t.jsonl"
    path.write_text('{"at": 0, "type": "a", "duration": 1}\n' + line + "\n")
    with pytest.raises(TraceError, match=message.replace("(", r"\(").replace("[", r"\[")):
        traces.read_trace(path, {"a": 0})


def test_a_line_that_is_not_utf8_is_named_and_a_byte_order_mark_is_read(tmp_path, starvation_files):
    _, workers_path = starvation_files
    job = b'{"at": 0, "type": "pdf", "duration": 1}\n'
    path = tmp_path / "t.jsonl"
    path.write_bytes(job + job + b'{"at": 1, "type": "pdf\xff", "duration": 1}\n')
    result = fairsched("simulate", str(path), "--workers", str(workers_path))
    assert result.returncode == 2
    assert result.stderr == f"fairsched: {path} line 3: not UTF-8 text (invalid start byte at byte 23)\n"
    path.write_bytes(b"\xef\xbb\xbf" + job + job)  # as Notepad saves it
    result = fairsched("simulate", str(path), "--workers", str(workers_path), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["jobs"] == 2


def test_a_quote_inside_a_type_is_not_taken_for_a_repeated_key(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"at": 0, "type": "a\\"b", "duration": 1, "priority": 2}\n')
    trace = traces.read_trace(path, {'a"b': 0})
    assert (trace.types, trace.priorities) == ([0], [2])


def test_an_empty_or_missing_trace_is_an_error(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(TraceError, match="no jobs in the trace"):
        traces.read_trace(tmp_path / "empty.jsonl", {"a": 0})
    with pytest.raises(TraceError, match="cannot read"):
        traces.read_trace(tmp_path / "missing.jsonl", {"a": 0})


# -- the command --------------------------------------------------------------------------------

@pytest.fixture
def starvation_files(tmp_path):
    return traces.starvation(flood_seconds=300.0, rare_at=15.0).write(tmp_path)


def test_simulate_prints_policies_side_by_side(starvation_files):
    trace_path, workers_path = starvation_files
    result = fairsched("simulate", str(trace_path), "--workers", str(workers_path))
    assert result.returncode == 0, result.stderr
    head = result.stdout.splitlines()[1]
    assert head.index("fairsched") < head.index("fifo") < head.index("priority")
    assert any(line.startswith("index ") for line in result.stdout.splitlines())
    assert "EVENTS/S" in result.stdout
    # Columns line up with their headings, the on-demand one empty here included.
    lines = result.stdout.splitlines()
    jobs_end = head.index("JOBS") + len("JOBS")
    rows = [ln for ln in lines[3:] if ln.startswith(("index ", "pdf "))]
    ends = [re.match(r"\S+\s+\d+\s+(\d+)", row).end(1) for row in rows]  # TYPE PRI JOBS
    assert len(rows) == 2 and ends == [jobs_end, jobs_end], lines
    # The first line says what the table holds, the line below it what `strd` counts: each
    # within 80 columns but for the trace's path.
    assert lines[0] == f"{trace_path}: 121 jobs on 4 slots; waits in seconds", lines
    assert lines[lines.index(rows[-1]) + 1] == (
        "strd: times a job waited although a better slot choice placed it"), lines


def test_simulate_spells_a_trace_path_with_a_line_break_on_its_tables_first_line(
        tmp_path, starvation_files):
    # The path was printed as it is: the table's first line split in two.
    trace_path, workers_path = starvation_files
    odd = tmp_path / "my\ntrace.jsonl"
    trace_path.rename(odd)
    result = fairsched("simulate", str(odd), "--workers", str(workers_path))
    assert result.returncode == 0, result.stderr
    first, head = result.stdout.splitlines()[:2]
    assert first == f"{str(odd)!r}: 121 jobs on 4 slots; waits in seconds", first
    assert head.startswith("TYPE"), head
    as_json = fairsched("simulate", str(odd), "--workers", str(workers_path), "--json")
    assert json.loads(as_json.stdout)["trace"] == str(odd)  # JSON keeps the path as it is


def test_simulate_of_one_job_on_one_slot_says_so_in_the_singular(tmp_path):
    (tmp_path / "w.toml").write_text('[[worker]]\nname = "pdf"\ntypes = ["pdf"]\n'
                                     'handler = "m:f"\n')
    (tmp_path / "t.jsonl").write_text('{"at": 0, "type": "pdf", "duration": 1}\n')
    result = fairsched("simulate", "t.jsonl", "--workers", "w.toml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "t.jsonl: 1 job on 1 slot; waits in seconds"


def test_simulate_of_jobs_that_take_no_time_shows_no_throughput(tmp_path):
    # Arrivals and ends at one instant: the makespan is 0, and jobs per second is no number.
    (tmp_path / "w.toml").write_text('[[worker]]\nname = "pdf"\ntypes = ["pdf"]\n'
                                     'handler = "m:f"\n')
    (tmp_path / "t.jsonl").write_text('{"at": 3, "type": "pdf", "duration": 0}\n' * 2)
    result = fairsched("simulate", "t.jsonl", "--workers", "w.toml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    head = lines.index(next(line for line in lines if line.startswith("POLICY ")))
    jobs_end = lines[head].index("JOBS/S") + len("JOBS/S")
    for line in lines[head + 1:]:
        assert line.split()[2:4] == ["0.0", "-"], lines
        assert line.index("-") == jobs_end - 1, lines
    result = fairsched("simulate", "t.jsonl", "--workers", "w.toml", "--json", cwd=tmp_path)
    assert {p["throughput"] for p in json.loads(result.stdout)["policies"].values()} == {None}


def test_simulate_json_for_chosen_policies(starvation_files):
    trace_path, workers_path = starvation_files
    result = fairsched("simulate", str(trace_path), "--workers", str(workers_path), "--json",
                       "--policy", "optimal", "--policy", "priority", "--policy", "optimal")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert list(data["policies"]) == ["optimal", "priority"]
    assert data["jobs"] == 121 and data["slots"] == 4
    groups = {g["type"]: g for g in data["policies"]["priority"]["groups"]}
    assert groups["index"]["wait_max"] == pytest.approx(300.0 - 15.0)
    assert data["policies"]["optimal"]["throughput"] > 0


def test_simulate_policy_names_in_any_case(starvation_files):
    trace_path, workers_path = starvation_files
    result = fairsched("simulate", str(trace_path), "--workers", str(workers_path), "--json",
                       "--policy", "FIFO", "--policy", "Fairsched", "--policy", "fifo")
    assert result.returncode == 0, result.stderr
    assert list(json.loads(result.stdout)["policies"]) == ["fifo", "fairsched"]


@pytest.mark.parametrize(("args", "message"), [
    (["--policy", "random"], "unknown policy 'random'"),
    (["--tick", "-1"], "--tick"),
    (["--tick", "1e-13"], "must be 0 or a number of seconds from 0.001 to 1e+09"),
    (["--tick", "inf"], "must be 0 or a number of seconds from 0.001 to 1e+09"),
])
def test_simulate_bad_usage_exits_2(starvation_files, args, message):
    trace_path, workers_path = starvation_files
    result = fairsched("simulate", str(trace_path), "--workers", str(workers_path), *args)
    assert result.returncode == 2
    assert message in result.stderr


def test_simulate_bad_trace_line_exits_2_with_one_line(tmp_path, starvation_files):
    _, workers_path = starvation_files
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"at": 0, "type": "pdf", "duration": 1}\n' * 3
                   + '{"at": 0, "type": "pdf", "duration": -4}\n')
    result = fairsched("simulate", str(bad), "--workers", str(workers_path))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "bad.jsonl line 4: 'duration' must be a number of seconds from 0" in result.stderr


LONG = "x" * 50000


@pytest.mark.parametrize(("job", "message"), [
    ({"type": LONG}, f"no worker handles type '{LONG[:100]}'... (50000 characters in all) ("),
    ({LONG: 1}, f"unknown key '{LONG[:100]}'... (50000 characters in all) (known: "),
    ({"priority": LONG}, f'\'priority\' must be an integer from 0 to 10, got "{LONG[:100]}"... '
                         "(50000 characters in all)"),
    ({"type": [LONG]}, f"'type' must be a non-empty string, got [\"{LONG[:98]}... "
                       "(50004 characters in all)"),
])
def test_simulate_quotes_a_bad_trace_line_on_one_short_line(tmp_path, starvation_files, job,
                                                             message):
    _, workers_path = starvation_files
    bad = tmp_path / "my\ntrace.jsonl"  # a line break in the name, as a careless script made it
    bad.write_text(json.dumps({"at": 0, "type": "pdf", "duration": 1} | job) + "\n")
    result = fairsched("simulate", str(bad), "--workers", str(workers_path))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and len(result.stderr) < 400, result.stderr[:1000]
    assert result.stderr.startswith(f"fairsched: {str(bad)!r} line 1: {message}"), result.stderr
    bad.unlink()
    result = fairsched("simulate", str(bad), "--workers", str(workers_path))
    assert result.stderr == f"fairsched: {str(bad)!r}: cannot read: No such file or directory\n"


def test_simulate_bad_workers_file_exits_2(tmp_path, starvation_files):
    trace_path, _ = starvation_files
    (tmp_path / "w.toml").write_text(textwrap.dedent("""
        [[worker]]
        name = "pdf"
        types = ["pdf"]
    """))
    result = fairsched("simulate", str(trace_path), "--workers", str(tmp_path / "w.toml"))
    assert result.returncode == 2
    assert "needs exactly one of 'handler' or 'command'" in result.stderr


def reference_starts(trace, slots, weights, tick):
    """The plain way: every cycle offers the whole backlog to core.plan_cycle."""
    pool = core.SlotPool()
    for sid, types in enumerate(slots):
        pool.add_slot(sid, sid, types)
    pending, running, starts = [], [], [math.nan] * len(trace)
    i = 0
    while i < len(trace) or running:
        now = min(trace.at[i] if i < len(trace) else math.inf,
                  running[0][0] if running else math.inf)
        now = math.ceil(now / tick) * tick if tick else now
        while i < len(trace) and trace.at[i] <= now:
            pending.append(i)
            i += 1
        while running and running[0][0] <= now:
            pool.release(heapq.heappop(running)[1])
        if pending and pool.n_free:
            cands = core.Candidates.from_lists(
                [trace.types[j] for j in pending], [trace.priorities[j] for j in pending],
                [trace.at[j] for j in pending], [trace.on_demand[j] for j in pending], pending)
            idx, sids = core.plan_cycle(pool, cands, now, weights)
            for k, sid in zip(idx, sids, strict=True):
                j = pending[k]
                starts[j] = now
                heapq.heappush(running, (now + trace.durations[j], sid))
            placed = set(idx)
            pending = [j for k, j in enumerate(pending) if k not in placed]
    return starts


def test_scores_tied_but_for_rounding_are_settled_as_the_core_settles_them(tmp_path):
    # At t=100 jobs 1 (priority 0, since 0.1) and 2 (priority 1, since 64.1) score alike;
    # the core starts the older, job 1. The per-type key of job 2 rounds a hair lower.
    path = tmp_path / "t.jsonl"
    path.write_text('{"at": 0, "type": "pdf", "duration": 100}\n'
                    '{"at": 0.1, "type": "pdf", "duration": 1}\n'
                    '{"at": 64.1, "type": "pdf", "duration": 1, "priority": 1}\n')
    (tmp_path / "w.toml").write_text('[[worker]]\nname = "pdf"\ntypes = ["pdf"]\n'
                                     'command = ["x"]\n')
    config = load_config(tmp_path / "w.toml")
    trace = traces.read_trace(path, sim.type_ids_of(config))
    slots = sim.slot_layout(config, sim.type_ids_of(config))
    result = sim.simulate(trace, slots, config.scoring, "fairsched", 0.0)
    assert result.starts == reference_starts(trace, slots, config.scoring, 0.0)
    assert result.starts == [0.0, 100.0, 101.0]


@pytest.mark.parametrize("tick", [0.0, 7.0])
def test_per_type_candidates_plan_as_the_whole_backlog_would(tmp_path, tick):
    trace, slots, config = load(traces.office_day(hours=2, seed=11), tmp_path)
    result = sim.simulate(trace, slots, config.scoring, "fairsched", tick)
    assert result.starts == reference_starts(trace, slots, config.scoring, tick)


def test_make_traces_script_writes_scenarios_simulate_reads(tmp_path):
    script = Path(__file__).parent.parent / "scripts" / "make_traces.py"
    made = subprocess.run([sys.executable, str(script), "--out", str(tmp_path), "starvation",
                           "random_load", "--jobs", "50"], capture_output=True, text=True,
                          timeout=120)
    assert made.returncode == 0, made.stderr
    assert len((tmp_path / "random_load.jsonl").read_text().splitlines()) == 50
    result = fairsched("simulate", str(tmp_path / "random_load.jsonl"), "--workers",
                       str(tmp_path / "random_load.workers.toml"), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["jobs"] == 50
    bad = subprocess.run([sys.executable, str(script), "--out", str(tmp_path), "nope"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown scenario 'nope'" in bad.stderr


def test_a_burst_of_identical_jobs_costs_a_cycle_its_free_slots_not_the_burst(tmp_path):
    # 6,000 jobs arriving at once on one slot: every cycle places one, and looks at a few
    # (it took minutes when each cycle offered the core the whole burst as near ties).
    path = tmp_path / "burst.jsonl"
    path.write_text('{"at": 0, "type": "pdf", "duration": 1}\n' * 6000)
    (tmp_path / "w.toml").write_text('[[worker]]\nname = "pdf"\ntypes = ["pdf"]\n'
                                     'command = ["x"]\n')
    config = load_config(tmp_path / "w.toml")
    type_ids = sim.type_ids_of(config)
    trace = traces.read_trace(path, type_ids)
    for policy in ("fairsched", "optimal"):
        result = sim.simulate(trace, sim.slot_layout(config, type_ids), config.scoring, policy)
        assert result.wall_seconds < 10, (policy, result.wall_seconds)
        assert result.starts == [float(j) for j in range(6000)]  # in file order


@pytest.mark.parametrize("tick", [0.0, 3.0])
def test_bursts_beside_near_ties_plan_as_the_whole_backlog_would(tmp_path, tick):
    # Copies of one job (a run) whose key is within rounding of other jobs' keys: the run's
    # surplus is set aside, the near ties behind it are still offered to the core.
    lines = []
    for step in range(40):
        at = 4.0 * step + (0.15 if step % 2 else 0.35)
        for copy in range(1 + step % 4):
            lines.append(json.dumps({"at": at, "type": "pdf",
                                     "priority": (step * 7 + copy) % 11,
                                     "duration": (1.0, 2.0, 3.3, 10.0)[step % 4]}))
    # The three excel slots free one by one from 1193.1 s on: then a priority-0 job of 112.3 s
    # and three priority-8 copies of 624.3 s score alike; the copies' key rounds a hair lower.
    lines += [json.dumps({"at": 0, "type": "excel", "duration": d}) for d in (1193.1, 1300, 1400)]
    lines += [json.dumps({"at": 112.3, "type": "excel", "priority": 0, "duration": 1})]
    lines += [json.dumps({"at": 624.3, "type": "excel", "priority": 8, "duration": 1})] * 3
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    _, workers_path = traces.office_day(hours=1).write(tmp_path)
    config = load_config(workers_path)
    type_ids = sim.type_ids_of(config)
    trace = traces.read_trace(path, type_ids)
    slots = sim.slot_layout(config, type_ids)
    result = sim.simulate(trace, slots, config.scoring, "fairsched", tick)
    assert result.starts == reference_starts(trace, slots, config.scoring, tick)
    older = trace.line.index(len(lines) - 3)
    assert (trace.at[older], trace.priorities[older]) == (112.3, 0)
    assert result.starts[older] == pytest.approx(1194.0 if tick else 1193.1)


def pdf_group_case(tmp_path, scoring: str, lines: str, settings: str = ""):
    """A pdf group (one command worker, `settings` added) scored by `scoring`, and a trace of
    `lines`, both written to tmp_path: (config, trace, slots)."""
    (tmp_path / "w.toml").write_text(f'[scoring]\n{scoring}\n\n[[worker]]\nname = "pdf"\n'
                                     f'types = ["pdf"]\ncommand = ["x"]\n{settings}')
    (tmp_path / "t.jsonl").write_text(lines)
    config = load_config(tmp_path / "w.toml")
    type_ids = sim.type_ids_of(config)
    return config, traces.read_trace(tmp_path / "t.jsonl", type_ids), sim.slot_layout(config,
                                                                                      type_ids)


def test_jobs_arriving_together_whose_keys_round_alike_still_go_by_priority(tmp_path):
    # priority_weight / age_weight = 1e-9 s per level: at 1e8 s, 5 levels (5e-9 s) are less
    # than the float spacing there, so the per-type keys of the two jobs come out equal. The
    # core, scoring them fresh, starts the priority-5 job first; so must the replay.
    config, trace, slots = pdf_group_case(
        tmp_path, "priority_weight = 1\nage_weight = 1e9",
        '{"at": 1e8, "type": "pdf", "priority": 0, "duration": 10}\n'
        '{"at": 1e8, "type": "pdf", "priority": 5, "duration": 10}\n')
    result = fairsched("simulate", str(tmp_path / "t.jsonl"), "--workers", str(tmp_path / "w.toml"), "--json",
                       "--policy", "fairsched", "--policy", "optimal")
    assert result.returncode == 0, result.stderr
    for name, policy in json.loads(result.stdout)["policies"].items():
        waits = {g["priority"]: g["wait_max"] for g in policy["groups"]}
        assert waits == {0: 10.0, 5: 0.0}, name
    for tick in (0.0, 3.0):
        replay = sim.simulate(trace, slots, config.scoring, "fairsched", tick)
        assert replay.starts == reference_starts(trace, slots, config.scoring, tick)


def test_a_stream_under_near_strict_priority_weights_costs_a_cycle_its_free_slots(tmp_path):
    # priority_weight / age_weight = 1e9 s per level: a priority-10 job's key is about -1e10.
    # Keys of jobs 2 ms apart are far more than rounding apart there, so a cycle takes the
    # two best, not the whole stream (5,000 jobs took 40 s when it offered them all).
    config, trace, slots = pdf_group_case(
        tmp_path, "priority_weight = 1e9\nage_weight = 1",
        "".join(json.dumps({"at": round(j * 0.002, 3), "type": "pdf", "priority": 10,
                            "duration": 0.5}) + "\n" for j in range(5000)), "processes = 2\n")
    for policy in ("fairsched", "optimal"):
        result = sim.simulate(trace, slots, config.scoring, policy)
        assert result.wall_seconds < 10, (policy, result.wall_seconds)
        # Oldest first, two at a time: each pair 0.5 s after the one before.
        assert result.starts == pytest.approx([j // 2 * 0.5 + j % 2 * 0.002
                                               for j in range(5000)]), policy


def test_scores_tied_by_a_large_rarity_weight_are_settled_as_the_core_settles_them(tmp_path):
    # rarity_weight 1e12: scores near 1e12 round to 1.2e-4 points, 7.6e-6 s of waiting. At
    # t=100 job 2 (priority 1, key 3e-6 s lower) and job 1 (priority 0) score alike; the core
    # starts the older, job 1, though the keys are 3,000 times further apart than 1e-9 of one.
    config, trace, slots = pdf_group_case(
        tmp_path, "rarity_weight = 1e12",
        '{"at": 0, "type": "pdf", "duration": 100}\n'
        '{"at": 1, "type": "pdf", "duration": 1}\n'
        '{"at": 64.999997, "type": "pdf", "duration": 1, "priority": 1}\n')
    for tick in (0.0, 3.0):
        result = sim.simulate(trace, slots, config.scoring, "fairsched", tick)
        assert result.starts == reference_starts(trace, slots, config.scoring, tick), tick
    assert result.starts[1] < result.starts[2]


def test_simulate_says_the_rate_of_jobs_that_take_no_time_to_speak_of_in_a_few_digits(tmp_path):
    # Two jobs of 1e-300 s each: JOBS/S was 2e300 written out, 300 digits across the table.
    workers = tmp_path / "workers.toml"
    workers.write_text('[[worker]]\nname = "a"\ntypes = ["a"]\nhandler = "h:f"\n')
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"at": 0, "type": "a", "duration": 1e-300}\n' * 2)
    result = fairsched("simulate", str(trace), "--workers", str(workers), "--policy", "fifo")
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    lines = result.stdout.splitlines()
    assert lines[-2].split() == ["POLICY", "STRANDED", "MAKESPAN", "JOBS/S", "CYCLES", "EVENTS/S"]
    assert lines[-1].split()[:5] == ["fifo", "0", "0.0", "1e+300", "2"], lines[-1]
    assert len(lines[-1]) < 80, result.stdout
