"""Scheduling quality tools: what the weights mean in time, trace replay, trace generators, plots.

`explain` turns the `[scoring]` weights into crossover times and score breakdowns,
`simulate` replays a job trace against the configured slots with the same compiled core the
supervisor uses, `traces` generates the classic scenarios, `plots` draws them (matplotlib).
"""

from fairsched.errors import FairschedError


class TraceError(FairschedError):
    """A trace file is unreadable or has a bad line: the message names the file and the line."""
