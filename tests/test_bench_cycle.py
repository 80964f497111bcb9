"""scripts/bench_cycle.py --quick: the actor's whole cycle beside plan_cycle, both cores, a row
per size, and the ratio at 2000 x 1000 on its last line."""

import math
import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench_cycle.py"
ROW = re.compile(r"^ +(\d+) x (\d+) +\d+ +(\d+) +\d+ +([\d.]+) +([\d.]+) +([\d.]+)x +([\d.]+) "
                 r"+([\d.]+) +([\d.]+)x$")


def test_the_cycle_benchmark_prints_a_row_per_size_and_the_ratio_last():
    result = subprocess.run([sys.executable, str(BENCH), "--quick"], capture_output=True,
                            text=True, timeout=300)
    # It exits with an error when the compiled core is missing, or when the actor's cycle and
    # plan_cycle placed different numbers of jobs.
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    lines = result.stdout.splitlines()
    rows = [m.groups() for m in map(ROW.match, lines) if m]
    assert [(c, s) for c, s, *_ in rows] == [("32", "16"), ("128", "64"), ("2000", "1000")]
    for _, slots, placed, c_e2e, c_core, c_ratio, py_e2e, py_core, py_ratio in rows:
        assert 0 < int(placed) <= int(slots)
        # The ratios are of the unrounded medians.
        assert math.isclose(float(c_ratio), float(c_e2e) / float(c_core), rel_tol=0.02)
        assert math.isclose(float(py_ratio), float(py_e2e) / float(py_core), rel_tol=0.02)
    ratio = rows[-1][5]
    assert lines[-1] == f"e2e/core at 2000 x 1000: {ratio}", lines[-1]
