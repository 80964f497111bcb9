"""fairsched: a fair supervisor for specialised worker processes.

The handler API lives here: handlers receive a `Job` and may raise `PermanentError`.
Applications enqueue through `fairsched.Queue` (imported on first use, so workers that only
need `Job` do not load the database driver); its errors are `FairschedError`s, an enqueue
under a key another job holds a `KeyConflict`.
"""

from fairsched.errors import FairschedError, PermanentError
from fairsched.job import ClaimLost, Job
from fairsched.store.errors import KeyConflict

__version__ = "0.1.0"
__all__ = ["ClaimLost", "FairschedError", "Job", "KeyConflict", "PermanentError", "Queue", "__version__"]


def __getattr__(name):
    if name == "Queue":
        from fairsched.store.queue import Queue

        return Queue
    raise AttributeError(f"module 'fairsched' has no attribute {name!r}")
