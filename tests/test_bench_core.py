"""scripts/bench_core.py --quick: both cores plan alike at every size, and the tables print."""

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench_core.py"


def test_the_core_benchmark_prints_a_row_per_size_and_per_outlier():
    result = subprocess.run([sys.executable, str(BENCH), "--quick"], capture_output=True,
                            text=True, timeout=300)
    # It exits with an error when the compiled core is missing or plans differently.
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    sizes = re.findall(r"^ +(\d+) x (\d+) +\d+ +(\d+) .* ([\d.]+)x ", result.stdout, re.M)
    assert [(c, s) for c, s, _, _ in sizes] == [
        ("32", "16"), ("512", "256"), ("2000", "1000"), ("20000", "10000")]
    for _, slots, placed, _ in sizes:
        assert 0 < int(placed) <= int(slots)
    outliers = re.findall(r"^ +(\(none\)|1 day|1 year) +[\d.]+ +[\d.]+ +[\d.]+x", result.stdout,
                          re.M)
    assert outliers == ["(none)", "1 day", "1 year"]
