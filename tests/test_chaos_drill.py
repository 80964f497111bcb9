"""scripts/chaos.py, briefly: supervisors under random faults keep every invariant it checks."""

import subprocess
import sys
from pathlib import Path

DRILL = Path(__file__).resolve().parent.parent / "scripts" / "chaos.py"


def test_a_short_fault_drill_keeps_every_invariant(short_tmp):
    result = subprocess.run([sys.executable, str(DRILL), "--supervisors", "2", "--jobs", "120",
                             "--seconds", "15", "--seed", "11", "--folder", str(short_tmp)],
                            capture_output=True, text=True, timeout=600)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr[-3000:]
    assert "every invariant held" in out
    faults = next(line for line in out.splitlines() if line.startswith("faults: "))
    assert faults != "faults: {}", out
    assert "jobs: 120; ended {" in out
