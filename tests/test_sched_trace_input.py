"""Where `fairsched simulate` reads its trace from: a file, or standard input given as '-'."""

from __future__ import annotations

import json
import subprocess
import sys

WORKERS = '[[worker]]\nname = "pdf"\ntypes = ["pdf"]\nhandler = "m:f"\n'
TRACE = '{"at": 0, "type": "pdf", "duration": 2}\n{"at": 1, "type": "pdf", "duration": 1}\n'


def simulate(*args, stdin=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "fairsched", "simulate", *args], input=stdin,
                          capture_output=True, text=True, timeout=120, cwd=cwd)


def test_a_trace_on_standard_input_is_read_as_a_file_would_be(tmp_path):
    # `make_traces ... | fairsched simulate -` said "-: cannot read: No such file or directory".
    (tmp_path / "workers.toml").write_text(WORKERS)
    (tmp_path / "t.jsonl").write_text(TRACE)
    piped = simulate("-", "--policy", "fifo", "--json", stdin=TRACE, cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr
    from_file = simulate("t.jsonl", "--policy", "fifo", "--json", cwd=tmp_path)
    piped, from_file = json.loads(piped.stdout), json.loads(from_file.stdout)
    assert piped["trace"] == "stdin" and piped["jobs"] == 2
    assert piped["policies"]["fifo"]["groups"] == from_file["policies"]["fifo"]["groups"]

    bad = simulate("-", stdin=TRACE + '{"at": 2}\n', cwd=tmp_path)
    assert (bad.returncode, bad.stderr) == (2, "fairsched: stdin line 3: 'type' is missing\n")
    empty = simulate("-", stdin="", cwd=tmp_path)
    assert (empty.returncode, empty.stderr) == (2, "fairsched: stdin: no jobs in the trace\n")
