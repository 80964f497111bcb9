"""fork_orphan, compiled and pure Python: the forked process re-parents to the subreaper at
once, the caller gets its pid, and nothing of the fork is left open."""

import os
import subprocess
import sys
import textwrap

import pytest

from fairsched.worker import _orphan_py, orphan

# In a process of its own, made a subreaper: as the supervisor is to its templates' workers.
SCRIPT = textwrap.dedent("""
    import os, sys, time
    from fairsched.worker._linux import set_child_subreaper
    from fairsched.worker.{module} import fork_orphan

    set_child_subreaper()
    me = os.getpid()
    fds_before = sorted(os.listdir("/proc/self/fd"))
    pid, middle = fork_orphan()
    if pid == 0:
        assert middle not in (me, os.getpid())
        deadline = time.monotonic() + 10
        while os.getppid() != me and time.monotonic() < deadline:
            time.sleep(0.001)
        os._exit(42 if os.getppid() == me else 1)
    fds_after = sorted(os.listdir("/proc/self/fd"))
    assert middle not in (me, pid)
    _, status = os.waitpid(pid, 0)  # ChildProcessError unless it is this process's child
    print(pid, os.waitstatus_to_exitcode(status), fds_before == fds_after)
""")


@pytest.mark.parametrize("module", ["_orphan_c", "_orphan_py"], ids=["c", "py"])
def test_the_orphan_is_the_subreapers_child_and_nothing_stays_open(module):
    run = subprocess.run([sys.executable, "-c", SCRIPT.format(module=module)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    pid, code, fds_unchanged = run.stdout.split()
    assert int(pid) > 0 and code == "42" and fds_unchanged == "True", run.stdout


def test_the_compiled_fork_orphan_is_live_unless_the_twin_is_asked_for():
    if os.environ.get("FAIRSCHED_REQUIRE_EXTENSIONS") == "1":
        assert orphan.__impl__ == "c"
    env = dict(os.environ, FAIRSCHED_NO_EXTENSIONS="1")
    env.pop("FAIRSCHED_REQUIRE_EXTENSIONS", None)
    run = subprocess.run([sys.executable, "-c", "import fairsched.worker.orphan as o; "
                          "print(o.__impl__, o.fork_orphan.__module__)"],
                         env=env, capture_output=True, text=True, timeout=60, check=True)
    assert run.stdout.split() == ["python", _orphan_py.__name__]
