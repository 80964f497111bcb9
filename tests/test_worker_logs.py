"""Worker logs: every line a handler or its libraries write (print, warnings, logging, a
thread's) carries the time and its job; the logs rotate at `log_max_bytes`, keeping
`log_backups` private copies, for Python workers (which rotate their own) and for `command`
workers (which the supervisor copies and truncates)."""

from __future__ import annotations

import json
import re
import stat

from tests.supervisor_harness import wait_until

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"

LOUD = '''
import logging, os, sys, threading, warnings

print("loading the model")  # at import: no job yet
both = threading.Barrier(2, timeout=30)  # the two "mine" jobs meet here: they run at once


def library_call():
    sys.stderr.write("somelib: retrying the connection\\n")  # as a library writes


def run(job):
    p = job.payload or {}
    if "lines" in p:  # a flood of them
        line = "x" * (p["width"] - 1)
        for _ in range(p["lines"]):
            print(line)
        return {"pid": os.getpid()}
    if "mine" in p:  # two jobs at once, each from its own thread, a line each in turn
        for n in range(p["mine"]):
            both.wait()  # the other job is running too, at its line n
            print(f"mine {job.id} {n}")
        return {"pid": os.getpid()}
    warnings.warn("frobnicate() is deprecated")
    logging.getLogger("somelib").warning("disk almost full")
    library_call()
    helper = threading.Thread(target=print, args=("from a thread the handler started",))
    helper.start()
    helper.join()
    print("two\\nlines", end="")
    print(" and the end of the second")
    return {"pid": os.getpid()}
'''


def loud_supervisor(supervisors, supervisor: str = "", extra: str = ""):
    sup = supervisors(f"""
[[worker]]
name = "w"
types = ["t"]
handler = "loud:run"
{extra}
""", supervisor=supervisor)
    (sup.dir / "loud.py").write_text(LOUD)
    return sup


def test_lines_a_handler_and_its_libraries_write_carry_the_time_and_the_job(supervisors):
    sup = loud_supervisor(supervisors).start()
    done = sup.cli("submit", "t", "--on-demand")
    assert done.returncode == 0, done.stderr
    logs = sup.dir / "state" / "logs"
    log = (logs / "w-1.log").read_text()
    job = re.escape("job od-1 (t): ")
    for line in [r"\S+/loud.py:\d+: UserWarning: frobnicate\(\) is deprecated",
                 r"  warnings.warn\(\"frobnicate\(\) is deprecated\"\)",
                 "WARNING somelib: disk almost full",
                 "somelib: retrying the connection",
                 "from a thread the handler started",
                 "two",
                 "lines and the end of the second"]:
        assert re.search(rf"^{STAMP} {job}{line}$", log, re.M), (line, log)
    # Imported by the group's template, before any job: the time alone.
    assert re.search(rf"^{STAMP} loading the model$", (logs / "w.template.log").read_text(),
                     re.M)


def test_the_lines_of_two_jobs_running_at_once_say_each_its_own_job(supervisors):
    sup = loud_supervisor(supervisors, extra="slots = 2").start()
    callers = [sup.spawn_cli("submit", "t", "--on-demand", "--payload", '{"mine": 100}')
               for _ in range(2)]
    for caller in callers:
        out, err = caller.communicate(timeout=60)
        assert caller.returncode == 0, err
    lines = re.findall(rf"^{STAMP} job (od-\d) \(t\): mine (od-\d) \d+$",
                       (sup.dir / "state" / "logs" / "w-1.log").read_text(), re.M)
    assert len(lines) == 200 and {said for said, _ in lines} == {"od-1", "od-2"}
    assert all(label == said for label, said in lines), lines


def test_what_a_handler_prints_is_written_once(supervisors):
    sup = loud_supervisor(supervisors).start()
    lines, width = 200_000, 100  # 20 MB
    done = sup.cli("submit", "t", "--on-demand", "--payload",
                   json.dumps({"lines": lines, "width": width}))
    assert done.returncode == 0, done.stderr
    log = sup.dir / "state" / "logs" / "w-1.log"
    with open(log, "rb") as f:
        prefix = len(f.readline()) - width  # the time and "job od-1 (t): "
    assert log.stat().st_size == lines * (width + prefix)


def private(path) -> bool:
    return stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_python_workers_log_rotates_at_log_max_bytes_keeping_log_backups(supervisors):
    sup = loud_supervisor(supervisors, supervisor='log_max_bytes = "1MB"\nlog_backups = 2\n')
    sup.start()
    done = sup.cli("submit", "t", "--on-demand", "--payload",
                   json.dumps({"lines": 200_000, "width": 100}))
    assert done.returncode == 0, done.stderr
    logs = sup.dir / "state" / "logs"
    kept = [logs / "w-1.log", logs / "w-1.log.1", logs / "w-1.log.2"]
    assert sorted(p.name for p in logs.glob("w-1.log*")) == [p.name for p in kept]
    for path in kept:
        assert 0 < path.stat().st_size <= 1 << 20 and private(path), path
    # Whole lines in each, the newest last: the rotation falls between lines.
    newest = [line for path in reversed(kept) for line in path.read_text().splitlines()]
    assert all(re.fullmatch(rf"{STAMP} job od-1 \(t\): x{{99}}", line) for line in newest)
    assert sum(path.stat().st_size for path in kept) <= 3 << 20  # of 26 MB written
    # The worker goes on in the new file: its next job's lines are there.
    again = sup.cli("submit", "t", "--on-demand")
    assert again.returncode == 0, again.stderr
    assert "job od-2 (t): from a thread the handler started" in kept[0].read_text()


def test_a_command_workers_log_is_copied_and_truncated_by_the_supervisor(supervisors):
    # A program of its own that prints 3 MB and then waits (it never says hello: it stays
    # starting for the 60 s of start_timeout, long enough).
    sup = supervisors("""
[[worker]]
name = "c"
types = ["c"]
command = ["sh", "-c", "head -c 3000000 /dev/zero | tr '\\\\0' x; exec sleep 60"]
start_timeout = 60
""", supervisor='log_max_bytes = "1MB"\nlog_backups = 1\n')
    sup.start(wait=False)
    logs = sup.dir / "state" / "logs"
    copy = logs / "c-1.log.1"
    wait_until(lambda: copy.exists() and copy.stat().st_size == 3_000_000, 20,
               "the supervisor's copy of c-1.log")
    assert (logs / "c-1.log").stat().st_size == 0
    assert private(copy) and private(logs / "c-1.log")
    assert set(copy.read_bytes()) == {ord("x")}
    assert sup.proc.poll() is None and "cannot rotate" not in sup.output()
