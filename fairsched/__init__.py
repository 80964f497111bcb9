"""fairsched: a fair supervisor for specialised worker processes.

The handler API lives here: handlers receive a `Job` and may raise `PermanentError`.
Applications enqueue through `fairsched.Queue` (imported on first use, so workers that only
need `Job` do not load the database driver).
"""

from fairsched.errors import PermanentError
from fairsched.job import Job

__version__ = "0.1.0"
__all__ = ["Job", "PermanentError", "Queue", "__version__"]


def __getattr__(name):
    if name == "Queue":
        from fairsched.store.queue import Queue

        return Queue
    raise AttributeError(f"module 'fairsched' has no attribute {name!r}")
