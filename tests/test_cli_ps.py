"""`fairsched ps` as a terminal shows it: narrowed to the terminal's width, and `--watch`
redraws only a terminal that can be redrawn. The table's layout (columns that line up, left
out or cut short) is tested as a function in tests/test_ps_table.py."""

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest

from fairsched.cli.common import display_width
from tests.supervisor_harness import read_until, wait_until

ECHO = """
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:echo"
"""

CLEAR = b"\x1b[H\x1b[2J"
HOME, ERASE_BELOW = b"\x1b[H", b"\x1b[J"


def test_ps_on_a_narrow_terminal_breaks_its_long_lines_between_words(supervisors):
    """The supervisor's line (SHUTTING DOWN made it 93 columns) and a fatal worker's note
    are broken between fields and words, not wherever the terminal's edge falls; into a
    pipe each stays one line."""
    sup = supervisors("""
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:slow"

[[worker]]
name = "broken"
types = ["broken"]
handler = "no_such_module_anywhere:handle"
""", shutdown_timeout=10).start()
    caller = sup.spawn_cli("submit", "pdf", "--on-demand", "--payload",
                           '{"seconds": 4, "ignore_cancel": true}')
    sup.wait_for(lambda ps: any(s["state"] == "busy" for s in ps["slots"]), what="busy")
    stopper = sup.spawn_cli("stop")
    sup.wait_for(lambda ps: ps["supervisor"]["shutting_down"], what="shutting down")
    seen, code = on_a_terminal(sup, ["ps"], "xterm-256color", columns=80)
    piped = sup.cli("ps").stdout.splitlines()
    assert code == 0, seen
    lines = seen.decode().replace("\r\n", "\n").splitlines()
    assert all(display_width(line) <= 80 for line in lines), seen
    assert lines[0].startswith("supervisor pid ") and lines[1].startswith("  "), seen
    assert lines[1].endswith("  SHUTTING DOWN") and "on-demand waiting 0" in lines[0] + lines[1]
    assert lines[2].startswith("WORKER"), seen
    note = lines.index(next(line for line in lines if line.startswith("broken-1 is fatal:")))
    assert lines[note + 1].startswith("  ") and len(lines) == note + 3, seen
    assert " ".join(line.strip() for line in lines[note:]) == piped[-1], (seen, piped)
    assert piped[0].endswith("SHUTTING DOWN") and piped[1].startswith("WORKER"), piped
    caller.communicate(timeout=30)
    stopper.communicate(timeout=30)


def on_a_terminal(sup, args, term: str | None, *, stream: str = "stdout",
                  interrupt_once=None, columns: int = 0) -> tuple[bytes, int]:
    """What `fairsched ARGS` writes to a terminal (its `stream` on a pty, `columns` wide if
    not 0) with TERM=`term` (None: unset), and its exit code: interrupted with Ctrl-C once
    `interrupt_once(what it wrote so far)` holds, or run to its end when None."""
    env = dict(sup.env)
    env.pop("TERM", None)
    env.pop("COLUMNS", None)
    if term is not None:
        env["TERM"] = term
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    other = subprocess.PIPE
    proc = subprocess.Popen([sys.executable, "-m", "fairsched", *args], env=env,
                            stdout=slave if stream == "stdout" else other,
                            stderr=slave if stream == "stderr" else other)
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            if interrupt_once is not None and interrupt_once(seen):
                proc.send_signal(signal.SIGINT)
                interrupt_once = None
            if select.select([master], [], [], 0.1)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer to the terminal has gone
                    break
                if not chunk:
                    break
                seen += chunk
            elif proc.poll() is not None and interrupt_once is None:
                break
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        os.close(master)
    return seen, proc.returncode


def tables(text: str) -> list[str]:
    """The tables of a plain `ps --watch`, each with its supervisor line, header and row."""
    return [t for t in text.strip("\n").split("\n\n") if t]


def rows_drawn(out: bytes) -> int:
    """How many times the slot's row has been written out whole."""
    return len(re.findall(rb"^pdf-1 [^\n]*\n", out, re.M))


def assert_plain_refreshes(text: str) -> None:
    assert "\x1b" not in text, text
    found = tables(text)
    assert len(found) >= 2, text
    for table in found:
        supervisor, header, row = table.splitlines()
        assert supervisor.startswith("supervisor pid "), table
        assert header.startswith("WORKER") and row.startswith("pdf-1 "), table


def test_ps_watch_into_a_pipe_prints_each_refresh_after_a_blank_line(supervisors):
    sup = supervisors(ECHO).start()
    watcher = subprocess.Popen([sys.executable, "-m", "fairsched", "ps", "--watch"],
                               env=dict(sup.env, TERM="xterm-256color"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sup.children.append(watcher)
    seen = read_until(watcher, lambda out: rows_drawn(out) >= 2, what="a table and its refresh")
    watcher.send_signal(signal.SIGINT)
    out, err = watcher.communicate(timeout=10)
    assert watcher.returncode == 0 and err == b"", err
    assert_plain_refreshes((seen + out).decode())


@pytest.mark.parametrize("term", ["dumb", None], ids=["dumb", "unset"])
def test_ps_watch_on_a_terminal_that_cannot_redraw_prints_plain_text(supervisors, term):
    sup = supervisors(ECHO).start()
    seen, code = on_a_terminal(
        sup, ["ps", "--watch"], term,
        interrupt_once=lambda seen: rows_drawn(seen) >= 2)
    assert code == 0, seen
    assert CLEAR not in seen, seen
    assert_plain_refreshes(seen.decode().replace("\r\n", "\n"))


def test_ps_watch_on_a_terminal_redraws_it_without_clearing_it(supervisors):
    """Each refresh is drawn over the last from the top left, every line erased to its end
    and the rest of the screen after the table: a screen cleared first flickers."""
    sup = supervisors(ECHO).start()
    seen, code = on_a_terminal(sup, ["ps", "--watch"], "xterm-256color",
                               interrupt_once=lambda seen: seen.count(ERASE_BELOW) >= 2)
    assert code == 0, seen
    assert b"\x1b[2J" not in seen, seen
    frames = seen.split(HOME)
    assert frames[0] == b"" and len(frames) >= 3, seen
    for frame in frames[1:]:
        table, _, after = frame.partition(ERASE_BELOW)
        lines = table.split(b"\r\n")
        assert lines[-1] == b"" and len(lines) == 4, frame
        assert all(line.endswith(b"\x1b[K") for line in lines[:-1]), frame
        assert lines[1].startswith(b"WORKER") and lines[2].startswith(b"pdf-1 "), frame
        assert after in (b"", b"\r\n"), frame  # the Ctrl-C's line break after the last


def test_on_demand_progress_is_drawn_only_where_a_line_can_be_redrawn(supervisors):
    sup = supervisors("""
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:slow"
""").start()
    args = ["submit", "pdf", "--on-demand", "--payload", '{"seconds": 1.5}']
    drawn, code = on_a_terminal(sup, args, "xterm-256color", stream="stderr")
    assert code == 0 and b"od-1:   0.0% started\x1b[K" in drawn, drawn
    for term in ("dumb", None):
        plain, code = on_a_terminal(sup, args, term, stream="stderr")
        assert code == 0 and plain == b"", plain  # the result goes to stdout, as ever


def test_on_demand_progress_wider_than_the_terminal_is_cut_short_not_wrapped(supervisors):
    """A progress line that wrapped left a row behind at every redraw: the carriage return
    only goes back to the start of the last one."""
    sup = supervisors("""
[[worker]]
name = "chatty"
types = ["chatty"]
handler = "sup_handlers:chatty"
""").start()
    args = ["submit", "chatty", "--on-demand", "--payload", '{"n": 20}']
    drawn, code = on_a_terminal(sup, args, "xterm-256color", stream="stderr", columns=80)
    assert code == 0, drawn
    lines = [line.removesuffix("\x1b[K") for line in drawn.decode().split("\r") if line]
    assert len(lines) >= 2 and lines[0].startswith("od-1:   0.0% step 0 of 20: xxx"), drawn
    assert all(display_width(line) <= 79 for line in lines), drawn
    assert lines[0].endswith("x…"), drawn


def test_an_on_demand_request_that_ends_after_its_progress_says_so_on_a_line_of_its_own(
        supervisors):
    """Its progress line is cleared before the one line that says why it ended, as it is
    before a result: no "od-1:   0.0% startedfairsched: job od-1: no result ..."."""
    sup = supervisors("""
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:slow"
""").start()
    args = ["submit", "pdf", "--on-demand", "--timeout", "1", "--payload", '{"seconds": 5}']
    drawn, code = on_a_terminal(sup, args, "xterm-256color", stream="stderr")
    assert code == 1, drawn
    assert b"od-1:   0.0% started\x1b[K" in drawn, drawn
    assert b"\r\x1b[Kfairsched: job od-1: no result within 1 s" in drawn, drawn


def test_an_on_demand_job_tried_again_after_a_crash_says_so_and_how_many_times_it_ran(
        supervisors):
    """The caller saw only the last attempt's error, as if the job had run once, and on a
    terminal the failed attempt's progress stayed drawn while the next one ran."""
    sup = supervisors("""
[[worker]]
name = "ex"
types = ["ex"]
handler = "sup_handlers:exits"
max_restarts = 10

[[worker]]
name = "bad"
types = ["bad"]
handler = "sup_handlers:fail_permanently"
""").start()
    args = ["submit", "ex", "--on-demand", "--payload", '{"code": 5}']
    piped = sup.cli(*args)
    assert (piped.returncode, piped.stdout) == (1, ""), piped
    assert piped.stderr == ("fairsched: job od-1 failed after 3 attempts: worker ex-1 exited "
                            "with code 5\n"), piped.stderr
    drawn, code = on_a_terminal(sup, args, "xterm-256color", stream="stderr")
    assert code == 1, drawn
    for attempt in (1, 2):
        assert (f"\rod-2: attempt {attempt} failed (worker ex-1 exited with code 5); trying "
                "again\x1b[K").encode() in drawn, drawn
    assert drawn.endswith(b"\r\x1b[Kfairsched: job od-2 failed after 3 attempts: worker ex-1 "
                          b"exited with code 5\r\n"), drawn
    once = sup.cli("submit", "bad", "--on-demand")  # not tried again: nothing more to say
    assert once.stderr == "fairsched: job od-3 failed: PermanentError: this input can never work\n"


def test_ps_watch_waits_through_a_restart_of_the_supervisor(supervisors, tmp_path):
    sup = supervisors(ECHO).start()
    files = {name: tmp_path / name for name in ("text", "text.err", "json", "json.err")}
    for kind, extra in (("text", []), ("json", ["--json"])):
        with open(files[kind], "wb") as out, open(files[f"{kind}.err"], "wb") as err:
            sup.children.append(subprocess.Popen(
                [sys.executable, "-m", "fairsched", "ps", "--watch", *extra], env=sup.env,
                stdout=out, stderr=err))
    watchers = sup.children[-2:]

    def text_seen():
        return files["text"].read_text()

    sup.wait_for(lambda ps: "pdf-1 " in text_seen() and files["json"].read_text(),
                 what="a first refresh")
    assert sup.cli("stop").returncode == 0
    assert sup.wait_exit() == 0
    wait_until(lambda: "waiting for it since" in text_seen(), what="the watch waiting",
               timeout=10)
    assert all(w.poll() is None for w in watchers)
    sup.start()
    wait_until(lambda: "pdf-1 " in text_seen().rpartition("waiting for it since")[2],
               what="a table after the restart", timeout=20)
    json_lines = files["json"].read_text().splitlines()
    wait_until(lambda: len(files["json"].read_text().splitlines()) > len(json_lines) + 1,
               what="JSON after the restart", timeout=10)
    for watcher in watchers:
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=10) == 0
    text = text_seen()
    assert "\n\nno supervisor is running on " in text, text
    assert text.count("waiting for it since") >= 1, text
    assert files["text.err"].read_text() == ""
    pids = {json.loads(line)["supervisor"]["pid"] for line in files["json"].read_text().splitlines()}
    assert len(pids) == 2, pids  # before the stop, and after the start
    (said,) = files["json.err"].read_text().splitlines()
    assert said.startswith("fairsched: no supervisor is running on ") and said.endswith(
        "; waiting for it"), said


def test_ps_says_which_worker_a_signal_has_stopped_and_how_to_wake_it(supervisors):
    sup = supervisors(ECHO).start()
    pid = sup.slots("pdf")[0]["pid"]
    said = (f"pdf-1 (pid {pid}) is stopped by a signal (SIGSTOP, Ctrl-Z): it runs nothing "
            f"until `kill -CONT {pid}`")
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(lambda: sup.slots("pdf")[0]["suspended"], what="pdf-1 seen stopped")
        table = sup.cli("ps")
        assert table.returncode == 0 and said in table.stdout.splitlines(), table.stdout
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(lambda: not sup.slots("pdf")[0]["suspended"], what="pdf-1 seen running")
    table = sup.cli("ps")
    assert table.returncode == 0 and "stopped by a signal" not in table.stdout, table.stdout


def test_ps_leaves_out_how_a_worker_last_exited_once_its_next_process_runs_a_job(supervisors):
    # The note says why RESTARTS went up; under a worker that has run fine since, it stayed
    # for good, as if the worker were still in trouble.
    sup = supervisors("""
[[worker]]
name = "ex"
types = ["ex"]
handler = "sup_handlers:exits"
max_attempts = 1
""").start()
    pid = sup.slots("ex")[0]["pid"]
    crash = sup.cli("submit", "ex", "--on-demand", "--payload", '{"code": 3}')
    assert crash.returncode == 1, crash.stderr
    sup.wait_for(lambda ps: ps["slots"][0]["pid"] not in (None, pid)
                 and ps["slots"][0]["state"] == "free", what="ex-1 back")
    assert "ex-1 last exited: exited with code 3" in sup.cli("ps").stdout.splitlines()
    assert sup.ps()["slots"][0]["recovered"] is False

    ran = sup.cli("submit", "ex", "--on-demand")
    assert ran.returncode == 0, ran.stderr
    table = sup.cli("ps").stdout
    assert "last exited" not in table, table
    (slot,) = sup.ps()["slots"]
    assert (slot["restarts"], slot["last_exit"], slot["recovered"]) == (
        1, "exited with code 3", True), slot
