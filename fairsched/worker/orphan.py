"""fork_orphan(): a forked process re-parented at once to the nearest subreaper (the
supervisor), as a template starts its workers. Compiled (_orphan_c) when it loads, else its
pure-Python twin (_orphan_py); FAIRSCHED_NO_EXTENSIONS=1 forces the twin. `__impl__` says
which one is live ("c" or "python")."""

import os
import sys

from fairsched.worker import _orphan_py

fork_orphan = _orphan_py.fork_orphan
__impl__ = "python"

if os.environ.get("FAIRSCHED_NO_EXTENSIONS") != "1" and sys.implementation.name == "cpython":
    try:
        from fairsched.worker._orphan_c import fork_orphan
    except ImportError:
        pass
    else:
        __impl__ = "c"

__all__ = ["__impl__", "fork_orphan"]
