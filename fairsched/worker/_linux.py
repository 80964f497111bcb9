"""prctl(2) through ctypes: parent-death signals for workers, child subreaping for the supervisor;
whole datagrams from a template's control socket; standard streams opened again."""

from __future__ import annotations

import os
import socket
import sys

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

_libc = None


def _prctl(option: int, value: int) -> bool:
    """Run prctl(option, value); False off Linux, OSError when the kernel refuses."""
    global _libc
    if not sys.platform.startswith("linux"):
        return False
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}, {value}) failed: {os.strerror(err)}")
    return True


def set_title(title: str) -> None:
    """What `ps` and `top` show for this process instead of its command line, which a worker
    forked from its template shares with every other one (setproctitle, when installed)."""
    try:
        from setproctitle import setproctitle
    except ImportError:
        return
    setproctitle(title)


def set_parent_death_signal(sig: int) -> bool:
    """Have the kernel send `sig` to this process when its parent (or subreaper) dies."""
    return _prctl(PR_SET_PDEATHSIG, sig)


def set_child_subreaper() -> bool:
    """Orphaned descendants of this process re-parent to it instead of to init."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def datagram_size(sock: socket.socket) -> int:
    """The length of the next datagram waiting on a SOCK_SEQPACKET socket, without taking it
    (Linux gives the whole length for MSG_TRUNC); 0 at EOF. Blocks, or raises, as a recv on
    `sock` would. A recv of a smaller buffer would cut the datagram and drop the rest."""
    return sock.recv_into(bytearray(1), 1, socket.MSG_PEEK | socket.MSG_TRUNC)


def reopen_standard_streams(log: int | None = None) -> dict[int, str]:
    """Open again what of fds 0-2 is closed: 0 on /dev/null, 1 and 2 on the descriptor `log`
    (else /dev/null too). Left closed, the next file opened would take its number, and what is
    printed (a traceback, say) would go into it: a lock file, a worker's socket. Returns {fd:
    where it went} for those opened."""
    reopened = {}
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        if fd != 0 and log is not None:
            try:
                os.dup2(log, fd)
                reopened[fd] = "this log"
                continue
            except OSError:
                pass
        try:
            null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
        except OSError:  # out of descriptors, say: better left closed than a job lost
            continue
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        reopened[fd] = os.devnull
    return reopened
