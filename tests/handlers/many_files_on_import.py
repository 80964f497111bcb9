"""A handler module that keeps more than a thousand files open from its import on (a cache of
open handles, say): the worker's own descriptors are then numbered past select()'s limit."""

import os
import resource

_soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if _soft != resource.RLIM_INFINITY and _soft < 1200:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1200, _hard), _hard))
HELD = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]


def handle(job):
    return {"pid": os.getpid(), "held": len(HELD), "highest": max(HELD)}
