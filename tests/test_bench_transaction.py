"""scripts/bench_transaction.py, short: the plain and the transactional no-op side by side,
and the throughput cost on its last line."""

import os
import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench_transaction.py"


def test_the_transaction_benchmark_prints_both_rates_and_the_cost(database_url):
    result = subprocess.run([sys.executable, str(BENCH), "--jobs", "300", "--processes", "2",
                             "--slots", "2", "--rounds", "1"], capture_output=True, text=True,
                            timeout=300, cwd=BENCH.parent,
                            env=dict(os.environ, FAIRSCHED_DATABASE_URL=database_url))
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == ("300 no-op jobs, 2 processes x 2 slots, PostgreSQL (FAIRSCHED_DATABASE_URL); "
                        "1 rounds"), lines
    plain = re.fullmatch(r"fairsched +(\d+) +\d+", lines[2])
    transactional = re.fullmatch(r"fairsched job\.transaction\(\) +(\d+) +\d+", lines[3])
    assert plain and transactional, lines
    assert int(plain[1]) > 0 and int(transactional[1]) > 0
    assert re.fullmatch(r"throughput cost of job\.transaction\(\): -?[\d.]+%", lines[4]), lines
