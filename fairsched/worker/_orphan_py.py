"""fork_orphan(), pure Python: the compiled module's twin (same API, same result), used when
the extension is not built. Its intermediate process is a whole forked interpreter."""

from __future__ import annotations

import os
import struct
import traceback

from fairsched.protocol import EXIT_SOFTWARE

_PID = struct.Struct("=i")


def fork_orphan() -> tuple[int, int]:
    """Fork a process whose parent (an intermediate) exits at once, so that it re-parents to
    the nearest subreaper. Returns (its pid, the intermediate's) in the caller, (0, the
    intermediate's pid) in the orphan. OSError when a fork fails."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        code = 0
        try:
            os.close(read_end)
            me = os.getpid()
            orphan = os.fork()
            if orphan == 0:
                os.close(write_end)
                return 0, me
            os.write(write_end, _PID.pack(orphan))
        except BaseException:
            traceback.print_exc()
            code = EXIT_SOFTWARE
        os._exit(code)
    os.close(write_end)
    try:
        data = b""
        while len(data) < _PID.size:
            chunk = os.read(read_end, _PID.size - len(data))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_end)
        try:
            os.waitpid(middle, 0)
        except ChildProcessError:  # SIGCHLD ignored by a handler's import: reaped already
            pass
    if len(data) != _PID.size:
        raise OSError("the intermediate child died before reporting the worker's pid")
    return _PID.unpack(data)[0], middle
