"""fork_orphan(), compiled: the intermediate process between the caller and its orphan runs no
Python at all (fork, write, _exit), where the pure-Python twin's runs the interpreter's whole
after-fork work (about a millisecond of CPU and as much latency on every worker's start)."""

from libc.errno cimport EINTR, errno
from posix.types cimport pid_t
from posix.fcntl cimport O_CLOEXEC
from posix.unistd cimport _exit, close, fork, getpid, read, write
from posix.wait cimport waitpid

cdef extern from "unistd.h":
    int pipe2(int *fds, int flags)

cdef extern from "Python.h":
    void PyOS_BeforeFork()
    void PyOS_AfterFork_Parent()
    void PyOS_AfterFork_Child()

from fairsched.protocol import EXIT_SOFTWARE

cdef int _cannot_fork = EXIT_SOFTWARE  # the intermediate's exit when its fork failed


def fork_orphan():
    """Fork a process whose parent (an intermediate) exits at once, so that it re-parents to
    the nearest subreaper. Returns (its pid, the intermediate's) in the caller, (0, the
    intermediate's pid) in the orphan, which gets the interpreter's after-fork treatment as
    os.fork's child does. OSError when a fork fails."""
    cdef int fds[2]
    cdef pid_t middle
    cdef pid_t me
    cdef pid_t orphan = -1
    cdef int status = 0
    cdef ssize_t got = -1
    cdef int err = 0
    if pipe2(fds, O_CLOEXEC) != 0:  # no program a worker or a handler starts holds it
        raise OSError(errno, "pipe() failed")
    PyOS_BeforeFork()
    middle = fork()
    if middle == 0:
        # The intermediate: async-signal-safe calls only, then gone.
        me = getpid()
        orphan = fork()
        if orphan == 0:
            close(fds[0])
            close(fds[1])
            PyOS_AfterFork_Child()
            return 0, me
        write(fds[1], &orphan, sizeof(orphan))
        _exit(0 if orphan > 0 else _cannot_fork)
    err = errno
    PyOS_AfterFork_Parent()
    close(fds[1])
    if middle < 0:
        close(fds[0])
        raise OSError(err, "fork() failed")
    while True:
        got = read(fds[0], &orphan, sizeof(orphan))
        if got >= 0 or errno != EINTR:
            break
    close(fds[0])
    while waitpid(middle, &status, 0) < 0 and errno == EINTR:
        pass
    if got != sizeof(orphan) or orphan <= 0:
        raise OSError("the intermediate child died before reporting the worker's pid")
    return orphan, middle
