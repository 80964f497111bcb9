"""Rows a claim lost to someone else's lock: left out of fetches for LOCKED_SKIP, then back."""

from fairsched.store.rows import Candidate
from fairsched.supervisor.locked_rows import LOCKED_SKIP, LockedRows


def rows(*specs):
    return [Candidate(job_id, type_name, 0, 0.0) for job_id, type_name in specs]


def test_rows_left_out_are_asked_for_on_top_and_dropped_from_the_answer():
    locked = LockedRows()
    assert not locked and locked.asking({"pdf": 2}) == {"pdf": 2}
    locked.note([(1, "pdf"), (2, "pdf"), (3, "pdf")], now=100.0)
    # Two candidates per free slot: three rows left out of pdf's answer take two slots' worth.
    assert locked.asking({"pdf": 2, "excel": 1}) == {"pdf": 4, "excel": 1}
    fetched = rows((1, "pdf"), (4, "pdf"), (2, "pdf"), (5, "pdf"), (6, "pdf"), (7, "pdf"),
                   (8, "pdf"), (9, "excel"))
    assert [r.id for r in locked.kept(fetched, {"pdf": 2, "excel": 1})] == [4, 5, 6, 7, 9]


def test_rows_come_back_once_their_time_is_up():
    locked = LockedRows()
    locked.note([(1, "pdf")], now=100.0)
    locked.note([(2, "pdf")], now=100.5)
    assert locked.next_retry() == 100.0 + LOCKED_SKIP
    assert not locked.expire(100.0 + LOCKED_SKIP - 0.01)
    assert locked.expire(100.0 + LOCKED_SKIP)  # row 1 is back; row 2 still left out
    assert [r.id for r in locked.kept(rows((1, "pdf"), (2, "pdf")), {"pdf": 1})] == [1]
    assert locked.expire(100.5 + LOCKED_SKIP) and not locked
    assert locked.next_retry() == float("inf")
