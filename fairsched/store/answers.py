"""Connections whose statements give up waiting for an answer: a command run against a server
that took its connection and then froze (stopped, swapped out, cut off behind a proxy) ends
with one line instead of waiting until Ctrl-C."""

from __future__ import annotations

import signal
import threading

import psycopg

from fairsched.store.errors import DatabaseUnavailable


class UnansweredStatement(DatabaseUnavailable):
    """The server did not answer a statement in time."""


class AnsweringConnection(psycopg.Connection):
    """A psycopg connection on which each round trip waits at most `within` seconds.

    The bound is a SIGALRM timer (psycopg's waits let signals through, as for Ctrl-C), so it
    holds on the main thread only; elsewhere a statement waits as long as it takes. A statement
    left unanswered closes the connection: nothing more can be said on it, and a rollback sent
    on the way out would wait as long again."""

    within: float = 30.0
    where: str = "PostgreSQL"
    hint: str = ""

    def wait(self, gen, *args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            return super().wait(gen, *args, **kwargs)
        waiting = True

        def expired(signum, frame):
            if waiting:
                raise UnansweredStatement(
                    f"{self.where} did not answer within {self.within:g} s{self.hint}")

        previous = signal.signal(signal.SIGALRM, expired)
        signal.setitimer(signal.ITIMER_REAL, self.within)
        try:
            return super().wait(gen, *args, **kwargs)
        except UnansweredStatement:
            self.pgconn.finish()
            raise
        finally:
            waiting = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
