"""A handler module that starts a thread at import and shares a lock with it: a worker forked
from a process that imported it would find the thread gone and, at times, the lock held."""

import threading
import time

LOCK = threading.Lock()


def _keep_busy():
    while True:
        with LOCK:
            time.sleep(0.001)
        time.sleep(0.001)


threading.Thread(target=_keep_busy, daemon=True).start()


def handle(job):
    with LOCK:
        return {"threads": threading.active_count()}
