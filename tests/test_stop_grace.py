"""A worker told to stop that exits within its grace is not said to have ignored SIGTERM, nor
killed, even when the supervisor hears of its exit only as the grace runs out."""

import os
import signal
import sys
import textwrap
import time

from tests.supervisor_harness import alive

# Says hello, then sleeps. SIGTERM makes it start a helper that keeps the worker's pipe open
# (as a job's subprocess may), and exit a second later: its exit comes as SIGCHLD alone.
SLOW_EXIT = textwrap.dedent("""
    import json, os, signal, socket, struct, sys, time

    sock = socket.socket(fileno=int(os.environ.get("FAIRSCHED_FD", "3")))
    hello = {"t": "hello", "protocol": 1, "pid": os.getpid(),
             "incarnation": os.environ["FAIRSCHED_INCARNATION"],
             "slots": int(os.environ["FAIRSCHED_SLOTS"]),
             "types": os.environ["FAIRSCHED_TYPES"].split(",")}
    data = json.dumps(hello).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)

    def leave(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        time.sleep(1)
        os._exit(0)

    signal.signal(signal.SIGTERM, leave)
    while True:
        time.sleep(60)
""")


def test_a_worker_exiting_within_its_grace_is_not_killed_for_ignoring_sigterm(supervisors):
    sup = supervisors("")
    script = sup.dir / "slow_exit.py"
    script.write_text(SLOW_EXIT)
    sup.config.write_text(sup.config.read_text() + textwrap.dedent(f"""
        [[worker]]
        name = "slow"
        types = ["slow"]
        command = ["{sys.executable}", "{script}"]
        """))
    sup.start()
    pid = sup.slots("slow")[0]["pid"]
    assert sup.cli("restart", "slow").returncode == 0
    # Frozen from just after its SIGTERM until past the 2 s grace: the worker exits meanwhile,
    # and the supervisor wakes to its SIGCHLD and its grace timer at once.
    began = time.monotonic()
    os.kill(sup.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(max(0.0, 2.6 - (time.monotonic() - began)))
    finally:
        os.kill(sup.proc.pid, signal.SIGCONT)
    sup.wait_for(lambda ps: sup.slots("slow")[0]["pid"] not in (None, pid), what="slow replaced")
    assert not alive(pid)
    out = sup.output()
    assert "worker slow-1 restarted by the operator" in out, out
    assert "after SIGTERM; killing it" not in out, out
    assert "worker slow-1 exited with code 0; restarting" in out, out


def test_a_worker_a_signal_has_stopped_is_continued_and_stops_in_good_order(supervisors):
    sup = supervisors("""
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:echo"
processes = 2
""").start()
    pids = [s["pid"] for s in sup.slots("pdf")]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)  # an operator's `kill -STOP`, a debugger
    try:
        assert sup.cli("restart", "pdf-1").returncode == 0
        ps = sup.wait_for(lambda ps: ps["slots"][0]["state"] == "free"
                          and ps["slots"][0]["pid"] != pids[0], what="pdf-1 restarted")
        assert ps["slots"][0]["last_exit"] == "exited with code 0 (restarted by the operator)"
        stop = sup.cli("stop")
        assert stop.returncode == 0, stop.stderr
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGCONT)
    out = sup.output()
    assert "worker pdf-2 stopped: exited with code 0" in out, out
    assert "SIGKILL" not in out and "ignored SIGTERM" not in out, out
