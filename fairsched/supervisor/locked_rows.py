"""Rows a claim lost to someone else's lock, left out of fetches for a while.

A claim lost on a row that is still pending afterwards was lost to a lock held by a
transaction of someone else's (a SELECT ... FOR UPDATE, say), not to another supervisor.
Fetched again at once it would be lost again, round after round as fast as the database
answers; and the best rows of a type locked so would hold back every job behind them. Such
rows are left out of fetches for LOCKED_SKIP seconds, then tried again.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable

LOCKED_SKIP = 1.0


class LockedRows:
    def __init__(self):
        self._rows: dict[int, tuple[str, float]] = {}  # id: (type, monotonic time to retry)

    def __bool__(self) -> bool:
        return bool(self._rows)

    def note(self, rows: Iterable[tuple[int, str]], now: float) -> None:
        """Leave these (id, type) rows out of fetches until LOCKED_SKIP from `now`."""
        until = now + LOCKED_SKIP
        for job_id, type_name in rows:
            self._rows[job_id] = (type_name, until)

    def next_retry(self) -> float:
        """When the first of them is to be tried again (monotonic); inf when there are none."""
        return min((until for _, until in self._rows.values()), default=math.inf)

    def expire(self, now: float) -> bool:
        """Forget the rows whose time is up; True if there were any, to be looked at afresh."""
        if not self._rows or now < self.next_retry():
            return False
        self._rows = {i: v for i, v in self._rows.items() if v[1] > now}
        return True

    def asking(self, wanted: dict[str, int]) -> dict[str, int]:
        """What to fetch for `wanted` free slots: enough more for the rows left out (fetch
        returns two per free slot) that the best of the others are in its answer."""
        if not self._rows:
            return wanted
        left_out = collections.Counter(t for t, _ in self._rows.values())
        return {t: n + (left_out[t] + 1) // 2 for t, n in wanted.items()}

    def kept(self, rows: list, wanted: dict[str, int]) -> list:
        """The fetched rows, less those left out, at most two per free slot of each type."""
        if not self._rows:
            return rows
        kept, taken = [], collections.Counter()
        for row in rows:
            if row.id not in self._rows and taken[row.type] < 2 * wanted.get(row.type, 0):
                taken[row.type] += 1
                kept.append(row)
        return kept
