"""A handler module that sets signal dispositions at import, as one that wants a stack dump on
SIGUSR1 (faulthandler) or to outlive a hangup does; its workers must keep them however started."""

import faulthandler
import os
import signal
import sys

faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
if os.environ.get("IGNORE_SIGCHLD"):  # children reap themselves
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)

USR2_SEEN = []  # a handler of the module's own (say, to reload its settings)
signal.signal(signal.SIGUSR2, lambda signum, frame: USR2_SEEN.append(signum))


def dispositions(job):
    return {"pid": os.getpid(), "hup": str(signal.getsignal(signal.SIGHUP)),
            "chld": str(signal.getsignal(signal.SIGCHLD)), "usr2": len(USR2_SEEN)}
