"""A handler module that puts its own writers in place of sys.stdout and sys.stderr at import,
as one sending its prints to a logger does: they write, and have no flush() or fileno()."""

import os
import sys


class LineWriter:
    def __init__(self, fd):
        self.fd = fd

    def write(self, text):
        os.write(self.fd, text.encode())
        return len(text)


sys.stdout = LineWriter(1)
sys.stderr = LineWriter(2)
IMPORTED_IN = os.getpid()


def handle(job):
    print(f"job {job.id} ran")
    return {"pid": os.getpid(), "imported_in": IMPORTED_IN}
