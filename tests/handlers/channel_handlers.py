"""Handlers that break the worker's channel to its supervisor (fd 3) from inside a job."""

import os


def close_channel(job):
    os.close(3)
    return "closed"


def replace_channel(job):
    """fd 3 closed, and the number given to a file: writes to it are not a socket's."""
    os.close(3)
    fd = os.open(os.devnull, os.O_WRONLY)
    return fd


def keep_only_the_channel(job):
    """Closes every descriptor above fd 3, as a handler that takes FAIRSCHED_FD for the only
    one its worker needs does."""
    os.closerange(int(os.environ["FAIRSCHED_FD"]) + 1, 1024)
    return "closed"
