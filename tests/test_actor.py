"""The actor driven in this process (tests/actor_harness.py): real workers, the real database,
its components' work seen through what it reports and what `ps` would show."""

import os
import re
import signal

from fairsched.supervisor.states import ProcessState
from tests.supervisor_harness import alive

OFFICE_AND_PDF = """
[[worker]]
name = "office"
types = ["pdf", "excel", "index"]
handler = "sup_handlers:slow"

[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:slow"
"""

SLOW_PDF = """
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:slow"
"""


def busy_workers(actor) -> list[str]:
    return [s["worker"] for s in actor.ps()["slots"] if s["job_id"] is not None]


def test_specialist_first_keeps_the_versatile_worker_free(actor):
    async def scenario(a):
        pdf = a.on_demand("pdf", {"seconds": 60})
        await a.until(lambda: busy_workers(a), what="the pdf job running")
        assert busy_workers(a) == ["pdf-1"]  # the specialist, not the office worker
        index = await a.on_demand("index", {"seconds": 0.1}).outcome()
        assert index["event"] == "result", index
        assert index["result"]["pid"] == a.proc("office-1").life.pid
        assert not pdf.request.done  # the index job did not wait for the pdf job
        # Its caller gives up: the job is cancelled where it runs.
        assert "asked to stop" in a.sup.jobs.abandon_request(pdf.request)
        await a.logged(r"job od-\d+ cancelled \(its caller left\): type pdf, worker pdf-1")

    actor(OFFICE_AND_PDF, scenario)


def test_a_killed_worker_is_replaced_and_its_on_demand_job_runs_again(actor):
    async def scenario(a):
        waiting = a.on_demand("pdf", {"seconds": 1})
        await a.until(lambda: busy_workers(a), what="the job running")
        first = a.proc("pdf-1").life
        old_pid = first.pid
        os.kill(old_pid, signal.SIGKILL)
        answer = await waiting.outcome()
        assert answer["event"] == "result", answer
        assert answer["result"]["attempt"] == 2
        events = [e["event"] for e in waiting.seen if e["event"] != "progress"]
        assert events == ["retry", "result"], waiting.seen
        worker = a.proc("pdf-1")
        assert worker.life is not first and worker.life.pid != old_pid  # a new incarnation
        assert not alive(old_pid)
        assert worker.restarts == 1
        assert worker.last_exit.startswith("killed by SIGKILL")
        assert a.reports.finished() == [("job_finished", "pdf", "retried"),
                                         ("job_finished", "pdf", "succeeded")]
        assert a.sup.counters()["restarts"] == 1

    actor(SLOW_PDF + "max_attempts = 2\n", scenario)


def test_the_last_worker_turning_fatal_answers_the_callers_waiting(actor):
    async def scenario(a):
        running = a.on_demand("pdf", {"seconds": 30})
        await a.until(lambda: busy_workers(a), what="the job running")
        behind = a.on_demand("pdf", {"seconds": 1})
        os.kill(a.proc("pdf-1").life.pid, signal.SIGKILL)  # its first crash makes it fatal
        for caller in (running, behind):
            answer = await caller.outcome()
            assert answer["event"] == "error", answer
            assert answer["error"].startswith(
                "no worker can run 'pdf' jobs: pdf-1 is fatal: killed by SIGKILL"), answer
        assert a.proc("pdf-1").state is ProcessState.FATAL
        # And a new one is told at once.
        late = await a.on_demand("pdf", {"seconds": 1}).outcome(timeout=1)
        assert late["error"].startswith("no worker can run 'pdf' jobs"), late

    actor(SLOW_PDF + "max_restarts = 0\n", scenario)


def test_an_import_error_is_fatal_at_once_said_once_and_told_to_callers(actor):
    async def scenario(a):
        worker = a.proc("pdf-1")
        assert worker.state is ProcessState.FATAL  # (the harness waits for ready or fatal)
        assert worker.restarts == 0 and worker.restart_timer is None  # no restart is coming
        reason = worker.fatal_reason
        assert reason.startswith("could not start: cannot import handler"), reason
        assert reason.count("could not start") == 1 and "no_such_module" in reason
        assert sum("is fatal" in line for line in a.reports.lines) == 1
        # A caller waiting for a result no worker can give hears so at once.
        answer = await a.on_demand("pdf").outcome(timeout=1)
        error = answer["error"]
        assert error.startswith("no worker can run 'pdf' jobs: pdf-1 is fatal: could not start: ")
        assert "((" not in error and "))" not in error, error
        assert "fairsched restart pdf" in error

    actor(SLOW_PDF.replace("sup_handlers:slow", "no_such_module:slow"), scenario)


FROZEN = """
[[worker]]
name = "frozen"
types = ["frozen"]
handler = "sup_handlers:environment_sizes"
"""


def test_a_template_that_dies_is_replaced_and_workers_fork_from_it_again(actor):
    # One kill (the OOM killer's, say) must not leave the group starting cold for good. A
    # worker forked from a template finds the template's objects frozen (gc.freeze); a cold
    # one finds none.
    async def scenario(a):
        templates = a.sup.workers.templates.templates  # by group: those ready to fork

        async def forked() -> bool:
            answer = await a.on_demand("frozen", {"names": []}).outcome()
            assert answer["event"] == "result", answer
            return answer["result"]["forked"]

        async def replace_worker() -> None:
            old = a.proc("frozen-1").life.pid
            os.kill(old, signal.SIGKILL)
            await a.until(lambda: a.proc("frozen-1").state is ProcessState.RUNNING
                          and a.proc("frozen-1").life.pid not in (None, old),
                          what="frozen-1 back")

        assert await forked()
        old = templates["frozen"]
        os.kill(old.pid, signal.SIGKILL)
        await a.logged(r"template for frozen exited; replacements start cold until a new one "
                       r"has imported sup_handlers:environment_sizes \(in 1 s\)")
        await replace_worker()  # at once: cold, the new template is still to come
        assert not await forked()
        # It has imported its module and takes spawns.
        await a.until(lambda: templates.get("frozen") not in (None, old),
                      what="a new template ready")
        await replace_worker()
        assert await forked()

    actor(FROZEN, scenario)


def imports_of(a, group: str) -> int:
    """How many templates of `group` began to import its handler."""
    return sum(f"template for {group} is importing" in line for line in a.reports.lines)


def test_a_fatal_groups_template_is_not_replaced_until_a_restart(actor):
    """A handler whose import ends the process (os._exit) kills its template, then its cold
    workers, which end fatal. From then on no template is started again every few seconds
    (none would fork a worker), until `fairsched restart` asks for one."""
    async def scenario(a):
        assert a.proc("gone-1").state is ProcessState.FATAL
        starts = imports_of(a, "gone")
        fatal_at = next(i for i, line in enumerate(a.reports.lines)
                        if "worker gone-1 is fatal" in line)
        templates = a.sup.workers.templates
        # One may have been under way as the worker went fatal: it is the last. Once it is
        # gone and no replacement is due, none is coming.
        await a.until(lambda: "gone" not in templates.warming_up
                      and "gone" not in templates.template_timers,
                      what="no template importing, none due")
        assert "gone" not in templates.templates
        assert imports_of(a, "gone") <= starts + 1, a.reports.lines
        assert not any("start cold until a new one" in line
                       for line in a.reports.lines[fatal_at:]), a.reports.lines
        before = imports_of(a, "gone")
        assert a.sup.workers.restart("gone") == ["gone-1"]
        await a.until(lambda: imports_of(a, "gone") > before,
                      what="a template started by the restart")

    actor("""
[[worker]]
name = "gone"
types = ["gone"]
handler = "exits_at_import:handle"
max_restarts = 1
""", scenario, modules={"exits_at_import": "import os\n\nos._exit(0)\n\n\ndef handle(job):\n"
                                          "    return None\n"})


def test_a_template_answer_read_after_its_worker_came_and_went_is_not_taken_for_a_new_worker(
        actor):
    """The template is slow to answer with the pid of the worker it forked (a fork hook of the
    handler's holds it up); by then that worker has said its hello and died. The late answer
    names a process already reaped: it is not taken for a worker spawned again (which would
    also have its process group killed later, by then perhaps another's)."""
    async def scenario(a):
        await a.logged(r"worker brief-1 is fatal", timeout=30)  # its first exit: no restart
        # The template's answer has been read (no spawn waits for it), and acted on.
        spawns = a.sup.workers.templates.pending_spawns
        await a.until(lambda: not spawns.get("brief"), what="the template's late answer read")
        spawned = [m[1] for line in a.reports.lines
                   if (m := re.search(r"worker brief-1 spawned \(pid (\d+)\)", line))]
        assert spawned and len(spawned) == len(set(spawned)), spawned
        assert a.proc("brief-1").state is ProcessState.FATAL

    actor("""
[[worker]]
name = "brief"
types = ["brief"]
handler = "brief:handle"
max_restarts = 0
""", scenario, modules={"brief": """\
        import os
        import threading
        import time

        TEMPLATE = os.getpid()


        def _template_answers_late():
            if os.getpid() == TEMPLATE:
                time.sleep(1.0)


        def _worker_dies_soon():
            if os.getppid() != TEMPLATE:  # the worker, not the intermediate child
                threading.Timer(0.2, os._exit, (3,)).start()


        os.register_at_fork(after_in_parent=_template_answers_late,
                            after_in_child=_worker_dies_soon)


        def handle(job):
            return os.getpid()
        """})


def test_a_queued_job_goes_from_the_table_to_a_worker_and_back(actor):
    async def scenario(a):
        job_id = await a.enqueue("pdf", {"seconds": 0.2})
        await a.until(lambda: a.reports.finished("succeeded"), what="the job succeeded")
        row = await a.until(lambda_row(a, job_id), what="its row updated")
        assert row["status"] == "succeeded" and row["attempts"] == 1, row
        assert a.sup.counters()["succeeded"] == 1
        assert a.sup.jobs.running == {}  # its slot is free again
        assert [s["state"] for s in a.ps()["slots"]] == ["free"]

    actor(SLOW_PDF, scenario)


def lambda_row(a, job_id):
    """A condition for `until` that is the job's row once it has finished."""
    import psycopg

    from fairsched.store.queue import Queue

    def finished():
        with psycopg.connect(a.database_url, autocommit=True) as conn:
            row = Queue(conn).get_job(job_id)
        return row if row and row["status"] not in ("pending", "running") else None

    return finished
