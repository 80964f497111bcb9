"""scripts/bench_recycle.py, short: the two setups side by side, the replacement gap of every
recycle seen in the log, and the throughput cost on its last line."""

import os
import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench_recycle.py"


def test_the_recycle_benchmark_prints_the_gap_and_the_cost(database_url):
    result = subprocess.run([sys.executable, str(BENCH), "--jobs", "400", "--processes", "2",
                             "--rounds", "1"], capture_output=True, text=True, timeout=300,
                            cwd=BENCH.parent,
                            env=dict(os.environ, FAIRSCHED_DATABASE_URL=database_url))
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    lines = result.stdout.splitlines()
    assert re.fullmatch(r"fairsched +\d+ +\d+", lines[2]), lines
    assert re.fullmatch(r"fairsched max_jobs = 100 +\d+ +\d+", lines[3]), lines
    gap = re.fullmatch(r"recycles: (\d+) \(about 4 expected\); replacement gap p50 ([\d.]+) ms, "
                       r"p99 ([\d.]+) ms, max ([\d.]+) ms, mean [\d.]+ ms", lines[4])
    assert gap, lines[4]
    recycles, p50, p99, top = int(gap[1]), float(gap[2]), float(gap[3]), float(gap[4])
    # 400 jobs over 2 processes recycling at about 100 each: the last ones end with the run.
    assert 2 <= recycles <= 5 and 0 < p50 <= p99 <= top, lines[4]
    assert re.fullmatch(r"throughput cost of max_jobs = 100: -?[\d.]+% \(best rounds; median "
                        r"rounds -?[\d.]+%\)", lines[5]), lines[5]
    cpu = re.fullmatch(r"CPU per job \(supervisor, workers, PostgreSQL; median of the rounds\): "
                       r"(\d+) us, with max_jobs = 100 (\d+) us: [+-][\d.]+%, (-?[\d.]+) ms a "
                       r"recycle", lines[6])
    # (On a machine as busy as the suite's, the difference is noise, below zero at times.)
    assert cpu and int(cpu[1]) > 0 and int(cpu[2]) > 0, lines[6]
