"""How a worker's end is put into words: the kernel's OOM kill count tells an out-of-memory
SIGKILL from an operator's `kill -9`."""

import os
import signal
import sys

from fairsched.supervisor.process import describe_exit, oom_kill_count


def ended_status(code: str, sig: int | None = None) -> int:
    """The raw waitpid status of a real process that runs `code`, killed by `sig` if given."""
    pid = os.posix_spawn(sys.executable, [sys.executable, "-c", code], os.environ)
    if sig is not None:
        os.kill(pid, sig)
    _, status = os.waitpid(pid, 0)
    return status


def killed_status(sig: int) -> int:
    return ended_status("import time; time.sleep(60)", sig)


def test_a_sigkill_is_out_of_memory_only_when_the_oom_count_rose():
    status = killed_status(signal.SIGKILL)
    assert describe_exit(status, oom_kills=(3, 4)) == (
        "killed by SIGKILL: out of memory (the kernel's OOM killer ran while it lived)")
    assert describe_exit(status, oom_kills=(3, 3)) == (
        "killed by SIGKILL from outside fairsched (not the OOM killer)")
    assert describe_exit(status, oom_kills=(None, 3)) == "killed by SIGKILL, perhaps out of memory"
    # The supervisor's own kill says so, whatever the count did meanwhile.
    assert describe_exit(status, {signal.SIGKILL}, (3, 9)) == "killed by SIGKILL from the supervisor"


def test_other_signals_and_exit_codes_ignore_the_oom_count():
    assert describe_exit(killed_status(signal.SIGTERM), oom_kills=(0, 5)) == "killed by SIGTERM"
    status = ended_status("raise SystemExit(3)")
    assert describe_exit(status, oom_kills=(0, 5)) == "exited with code 3"


def test_the_oom_count_is_read_from_vmstat(tmp_path):
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 1\noom_kill 17\nother 2\n")
    assert oom_kill_count(str(vmstat)) == 17
    vmstat.write_text("nr_free_pages 1\n")
    assert oom_kill_count(str(vmstat)) is None
    assert oom_kill_count(str(tmp_path / "missing")) is None
    if os.path.exists("/proc/vmstat"):  # this machine's kernel keeps the count
        assert isinstance(oom_kill_count(), int)
