"""fairsched: a fair supervisor for specialised worker processes.

The handler API lives here: handlers receive a `Job` and may raise `PermanentError`.
"""

from fairsched.errors import PermanentError
from fairsched.job import Job

__version__ = "0.1.0"
__all__ = ["Job", "PermanentError", "__version__"]
