"""`fairsched reload` and SIGHUP against a real `fairsched supervise` (tests/supervisor_harness.py),
as operators use them; the behaviour in detail is tests/test_reload.py's."""

import json
import re
import signal

from tests.supervisor_harness import wait_until

HEADER = '[supervisor]\nstate_dir = "state"\nshutdown_timeout = 5\n\n[scoring]\n'

PDF = """
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:echo"
processes = 2
"""

SLOW = """
[[worker]]
name = "slow"
types = ["slow"]
handler = "sup_handlers:slow"
"""


def taking_work(ps: dict, type_name: str) -> set[str]:
    return {s["worker"] for s in ps["slots"]
            if s["state"] in ("free", "busy") and type_name in s["types"]}


def test_fairsched_reload_refuses_a_bad_file_then_applies_a_good_one(supervisors):
    sup = supervisors(PDF).start()
    pids = sorted(s["pid"] for s in sup.slots())
    sup.config.write_text(HEADER + PDF + SLOW + "slots = 0\n")
    bad = sup.cli("reload")
    assert bad.returncode == 2, bad
    assert bad.stderr.strip().splitlines() == [
        f"fairsched: {sup.config}: [[worker]] 'slow' key 'slots' must be >= 1, "
        "got 0"], bad.stderr
    sup.config.write_text(HEADER.replace('state_dir = "state"', 'state_dir = "moved"')
                          + PDF + SLOW)
    moved = sup.cli("reload", "--socket", str(sup.dir / "state" / "control" / "sock"))
    assert moved.returncode == 2, moved
    assert "[supervisor] key 'state_dir' changed: that takes a restart" in moved.stderr
    sup.config.write_text(HEADER + PDF)
    assert sorted(s["pid"] for s in sup.slots()) == pids  # nothing changed
    sup.config.write_text(HEADER + PDF.replace("sup_handlers:echo", "sup_handlers:measure")
                          + SLOW)
    good = sup.cli("reload")
    assert good.returncode == 0, good
    assert good.stdout.splitlines() == [
        "reloaded: group slow: added (1 process, types slow)",
        "reloaded: group pdf: changed, its processes replaced one at a time (handler)"]
    sup.wait_output(r"reloaded workers\.toml: group pdf: changed")
    lowest = [2]

    def replaced(ps):
        lowest.append(len(taking_work(ps, "pdf")))
        rows = {s["worker"]: s for s in ps["slots"]}
        return (set(rows) == {"pdf-1", "pdf-2", "slow-1"}
                and all(r["state"] == "free" for r in rows.values())
                and not {rows["pdf-1"]["pid"], rows["pdf-2"]["pid"]} & set(pids))

    sup.wait_for(replaced, what="pdf replaced and slow started")
    assert min(lowest) >= 1, lowest
    answer = sup.cli("submit", "pdf", "--on-demand", "--payload", '"abc"')
    assert answer.returncode == 0, answer
    assert json.loads(answer.stdout) == {"length": 3, "characters": ["a", "b", "c"]}
    slow = sup.cli("submit", "slow", "--on-demand", "--payload", '{"seconds": 0.1}')
    assert slow.returncode == 0, slow


def test_sighup_reloads_as_the_command_does(supervisors):
    sup = supervisors(PDF + SLOW).start()
    sup.config.write_text(HEADER + PDF + 'slots = "x"\n')
    sup.signal(signal.SIGHUP)
    sup.wait_output(r"reload refused, nothing changed: .*workers\.toml: \[\[worker\]\] 'pdf' "
                    r"key 'slots' must be an integer")
    assert {s["worker"] for s in sup.slots()} == {"pdf-1", "pdf-2", "slow-1"}
    sup.config.write_text(HEADER + PDF.replace("processes = 2", "processes = 1"))
    sup.signal(signal.SIGHUP)
    sup.wait_output(r"reloaded workers\.toml: group slow: removed")
    sup.wait_output(r"reloaded workers\.toml: group pdf: resized \(processes\)")
    sup.wait_for(lambda ps: {s["worker"] for s in ps["slots"]} == {"pdf-1"},
                 what="slow-1 and pdf-2 gone")
    assert sup.proc.poll() is None
    gone = sup.cli("submit", "slow", "--on-demand")
    assert gone.returncode == 2 and "no worker group" in gone.stderr, gone
    log = sup.output()
    assert re.search(r"worker slow-1 stopped: .* \(removed from workers\.toml\)", log), log
    wait_until(lambda: sup.cli("submit", "pdf", "--on-demand").returncode == 0, what="pdf")
