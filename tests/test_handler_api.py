"""Handlers as their authors write them, run by a real supervisor: what each shape of handler
gets for its jobs, seen from the command line."""

from __future__ import annotations

import json


def worker(handler: str, extra: str = "") -> str:
    return f"""
[[worker]]
name = "w"
types = ["t"]
handler = "sup_handlers:{handler}"
max_attempts = 1
{extra}"""


def test_a_plain_handler_returning_an_async_call_has_it_awaited(supervisors):
    sup = supervisors(worker("wraps_async")).start()
    ok = sup.cli("submit", "t", "--on-demand", "--payload", '{"page": 1}')
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["rendered"] == {"page": 1}
    failed = sup.cli("submit", "t", "--on-demand", "--payload", '{"fail": true}')
    assert failed.returncode == 1 and "the awaited call failed" in failed.stderr, failed.stderr
    assert "never awaited" not in (sup.dir / "state" / "logs" / "w-1.log").read_text()
