"""`fairsched ps` as a terminal shows it: the table's columns line up whatever a handler says."""

import json

from fairsched.cli.common import display_width


def column_of(line: str, index: int) -> int:
    """The terminal column where character `index` of `line` is drawn."""
    return display_width(line[:index])


def test_ps_lines_up_a_progress_message_of_wide_characters(supervisors):
    sup = supervisors("""
[[worker]]
name = "says"
types = ["says"]
handler = "sup_handlers:says"
processes = 2
""").start()
    # Each CJK character takes two terminal columns; past 30 columns the message is cut.
    caller = sup.spawn_cli("submit", "says", "--on-demand", "--payload",
                           json.dumps({"message": "処理中ページ" * 8}))
    sup.wait_for(lambda ps: any(s["message"] for s in ps["slots"]), what="the message")
    result = sup.cli("ps")
    caller.kill()
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()[1:3 + 1]
    busy = next(row for row in rows if "処理中" in row)
    assert display_width(busy[busy.index("50%"):busy.rindex("ジ") + 1]) <= 30, busy
    for row in rows:
        # RESTARTS starts where its header does, and so does every column after it.
        restarts = row.index(" 0 ", row.index("says", row.index("-") + 1)) + 1
        assert column_of(row, restarts) == column_of(header, header.index("RESTARTS")), (
            header, row)
