"""Templates: pre-loaded processes that fork ready workers, and the fallbacks when they fail."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from handlers.worker_peer import HERE, Peer, _alive, make_spec, spawn

from fairsched.supervisor.template_process import StartsCold, Template
from fairsched.worker.launch import LaunchError, launch


@pytest.fixture
def templates(tmp_path):
    """start(**spec fields) -> (Template, spec); spawn(...) -> Peer, forked as the supervisor
    asks for one; everything is cleaned up."""
    started: list[Template] = []
    peers: list[Peer] = []

    class Lab:
        def start(self, **fields):
            spec = make_spec(tmp_path, **fields)
            template = Template.start(spec)
            started.append(template)
            return template, spec

        def spawn(self, template, spec, incarnation="inc-1"):
            peer = Peer(spawn(template, spec, incarnation), incarnation, spec, child=False)
            peers.append(peer)
            return peer

        def cold(self, spec, incarnation="inc-1"):
            peer = Peer(launch(spec, incarnation), incarnation, spec)
            peers.append(peer)
            return peer

    yield Lab()
    for peer in peers:
        peer.cleanup()
    for template in started:
        template.close()
        try:
            if os.waitpid(template.pid, os.WNOHANG)[0] == 0:
                os.kill(template.pid, signal.SIGKILL)
                os.waitpid(template.pid, 0)
        except ChildProcessError:
            pass  # the test reaped it already


def test_template_forks_workers_that_reuse_its_imports(templates):
    template, spec = templates.start()
    peer = templates.spawn(template, spec)
    assert peer.hello() == {"t": "hello", "protocol": 1, "pid": peer.pid,
                            "incarnation": "inc-1", "slots": 1, "types": ["echo"]}
    peer.run(1, payload=[1, 2])
    result = peer.expect("result")["result"]
    assert result["pid"] == peer.pid != template.pid
    assert result["imported_in"] == template.pid  # the handler module was not imported again


def test_template_workers_leave_the_shared_imports_out_of_their_collections(templates):
    """The handler's modules, imported once in the template, are frozen before the fork (the
    workers' collections would otherwise write to every page they share); collection is on."""
    template, spec = templates.start(handler="worker_handlers:gc_state")
    forked = templates.spawn(template, spec)
    cold = templates.cold(spec, incarnation="inc-2")
    states = {}
    for name, peer in (("forked", forked), ("cold", cold)):
        peer.hello()
        peer.run(1)
        states[name] = peer.expect("result")["result"]
    assert states["forked"]["enabled"] and states["cold"]["enabled"]
    assert states["forked"]["frozen"] > 1000, states  # the runtime and the handler's imports
    assert states["cold"]["frozen"] == 0, states


def test_each_spawn_is_a_fresh_worker_for_its_incarnation(templates, tmp_path):
    template, spec = templates.start(name="w-1")
    first = templates.spawn(template, spec, "inc-1")
    first.hello()
    os.kill(first.pid, signal.SIGKILL)  # a crash; its replacement comes from the template
    first.wait_exit()
    second = templates.spawn(template, make_spec(tmp_path, name="w-2"), "inc-2")
    assert second.hello()["incarnation"] == "inc-2"
    assert second.pid != first.pid
    second.run(1, incarnation="inc-1")  # work for the dead incarnation is refused
    assert second.recv()["t"] == "refused"
    second.run(2)
    assert second.expect("result")["job_id"] == 2
    assert (tmp_path / "w-2.log").exists()


def test_template_worker_sees_the_same_setup_as_a_cold_one(templates, tmp_path):
    template, spec = templates.start(handler="worker_handlers:environment", env={"EXTRA": "1"})
    forked = templates.spawn(template, spec, "inc-f")
    cold = templates.cold(spec, "inc-c")
    seen = []
    for peer in (forked, cold):
        peer.hello()
        peer.run(1)
        seen.append(peer.expect("result")["result"])
    for one in seen:
        one.pop("pid")
        one.pop("sid")
        one["env"].pop("FAIRSCHED_INCARNATION")
    assert seen[0] == seen[1]
    assert seen[0]["cwd"] == str(HERE.resolve()) and seen[0]["stdin_is_devnull"]


def test_template_worker_runs_in_its_own_session_with_its_own_log(templates, tmp_path):
    template, spec = templates.start(handler="worker_handlers:environment")
    peer = templates.spawn(template, spec)
    peer.hello()
    peer.run(1)
    assert peer.expect("result")["result"]["sid"] == peer.pid
    peer.send({"t": "stop"})
    peer.wait_exit()
    assert "could not start" not in peer.log()


def test_template_that_cannot_import_the_handler_reports_and_falls_back(templates, tmp_path):
    template, spec = templates.start(handler="no_such_module_here:run")
    with pytest.raises(LaunchError, match="No module named 'no_such_module_here'"):
        template.wait_ready()
    assert os.waitpid(template.pid, 0)[1] == 78 << 8
    for _ in range(2):  # stays failed
        with pytest.raises(LaunchError, match="No module named"):
            template.wait_ready()
        with pytest.raises(LaunchError, match="No module named"):
            template.begin_spawn(spec, "inc-2")
    # The cold start the supervisor turns to reports the problem as the worker's own.
    peer = templates.cold(spec, "inc-3")
    assert peer.recv()["t"] == "fatal"
    assert peer.wait_exit() == 78
    assert "No module named 'no_such_module_here'" in peer.log().splitlines()[-1]


def test_a_long_import_error_comes_back_whole_from_the_template(templates):
    template, spec = templates.start(handler="long_failure_on_import:run")
    with pytest.raises(LaunchError) as failed:
        template.wait_ready()
    said = str(failed.value)
    assert said.startswith("template for w could not start: cannot import handler "
                           "'long_failure_on_import:run': RuntimeError: the settings file is "
                           "not valid: ééé"), said[:300]
    assert said.endswith("é ...") and len(said) < 9000, said[-300:]
    assert os.waitpid(template.pid, 0)[1] == 78 << 8


def test_a_handler_that_starts_threads_at_import_gets_cold_workers(templates):
    # A fork carries over the forking thread alone: the template will not fork these.
    template, spec = templates.start(handler="thread_on_import:handle")
    with pytest.raises(StartsCold, match=r"importing thread_on_import:handle started 1 "
                                         r"thread\(s\), which a forked worker would not have"):
        template.wait_ready()
    assert os.waitpid(template.pid, 0)[1] == 0
    with pytest.raises(LaunchError, match="its workers start cold"):
        template.begin_spawn(spec, "inc-1")
    peer = templates.cold(spec, "inc-1")
    peer.hello()
    for job in range(1, 4):
        peer.run(job)
        assert peer.expect("result")["result"]["threads"] >= 2  # its own thread, alive


def test_a_dead_template_answers_no_spawn_and_its_workers_start_cold(templates):
    template, spec = templates.start()
    template.wait_ready()
    os.kill(template.pid, signal.SIGKILL)
    os.waitpid(template.pid, 0)
    with pytest.raises(LaunchError, match=r"template for w is gone \(Broken pipe\)"):
        template.begin_spawn(spec, "inc-1")
    with pytest.raises(LaunchError, match=r"template for w is gone"):  # for good
        template.begin_spawn(spec, "inc-1")
    peer = templates.cold(spec, "inc-2")
    assert peer.hello()["incarnation"] == "inc-2"


def test_a_workers_log_that_cannot_be_opened_is_not_the_templates_fault(templates):
    template, spec = templates.start()
    template.wait_ready()
    spec.log_path.mkdir()  # a folder where the worker's log goes: no start can open it
    with pytest.raises(OSError) as raised:
        template.begin_spawn(spec, "inc-1")
    assert not isinstance(raised.value, LaunchError)  # the log's fault, said as such
    assert raised.value.filename == str(spec.log_path)
    # Not blamed: the next worker with a log forks from it.
    peer = templates.spawn(template, make_spec(spec.log_path.parent, name="w-2"), "inc-2")
    assert peer.hello()["incarnation"] == "inc-2"


def test_template_exits_when_its_control_socket_closes(templates):
    template, spec = templates.start()
    template.wait_ready()
    template.close()
    assert os.waitpid(template.pid, 0)[1] == 0
    with pytest.raises(LaunchError, match="template for w is gone"):
        template.begin_spawn(spec, "inc-1")


def test_spawn_refuses_a_spec_of_another_group(templates, tmp_path):
    template, spec = templates.start()
    template.wait_ready()
    with pytest.raises(ValueError, match="runs 'worker_handlers:echo'"):
        template.begin_spawn(make_spec(tmp_path, handler="worker_handlers:fail"), "inc-1")
    with pytest.raises(ValueError, match="Python handlers only"):
        Template.start(make_spec(tmp_path, handler=None, command=("true",)))


@pytest.mark.parametrize("mode", ["cold", "template"])
def test_worker_dies_with_its_supervisor_even_without_eof(mode):
    probe = Path(__file__).parent / "handlers" / "pdeath_probe.py"
    done = subprocess.run([sys.executable, str(probe), mode], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    try:
        deadline = time.monotonic() + 10
        while _alive(report["worker"]) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _alive(report["worker"]), "the worker outlived its supervisor"
    finally:
        for pid in (report["worker"], report["holder"]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(report["dir"], ignore_errors=True)


def test_template_workers_are_children_of_a_subreaper():
    probe = Path(__file__).parent / "handlers" / "subreaper_probe.py"
    done = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["parent"] == report["me"]  # re-parented from the template to the probe
    assert report["exit"] == 0  # and the probe could reap it with waitpid
    assert report["hello_pid"] == report["worker"] != report["template"]
    assert report["imported_in"] == report["template"]


@pytest.mark.parametrize("how", ["forked", "cold"])
def test_signal_dispositions_set_at_import_hold_in_every_worker(templates, how):
    """A handler module that asks for a stack dump on SIGUSR1 (faulthandler) and ignores
    SIGHUP at import gets both in its workers, forked from the template or started cold."""
    template, spec = templates.start(handler="signals_on_import:dispositions")
    peer = templates.spawn(template, spec) if how == "forked" else templates.cold(spec)
    peer.hello()
    for sig in (signal.SIGUSR1, signal.SIGHUP):
        os.kill(peer.pid, sig)
    peer.run(1)
    result = peer.expect("result")["result"]
    assert result["pid"] == peer.pid and result["hup"] == str(signal.SIG_IGN), result
    wait_until_logged = time.monotonic() + 10
    while "most recent call first" not in peer.log() and time.monotonic() < wait_until_logged:
        time.sleep(0.02)
    assert "most recent call first" in peer.log()  # faulthandler's dump, in the worker's log


def test_a_handler_that_replaces_stdout_and_stderr_at_import_still_gets_forked_workers(
        templates):
    template, spec = templates.start(handler="streams_on_import:handle")
    peer = templates.spawn(template, spec)
    peer.hello()
    peer.run(1)
    assert peer.expect("result")["result"] == {"pid": peer.pid, "imported_in": template.pid}
    assert "job 1 ran" in peer.log()
    assert "spawn failed" not in (Path(spec.log_path).parent / "w.template.log").read_text()

def test_a_handler_that_ignores_sigchld_at_import_still_gets_forked_workers(templates):
    """SIGCHLD ignored by the handler's import: the template's children reap themselves, and
    its spawns go on all the same."""
    template, spec = templates.start(handler="signals_on_import:dispositions",
                                     env={"IGNORE_SIGCHLD": "1"})
    peer = templates.spawn(template, spec)
    peer.hello()
    peer.run(1)
    result = peer.expect("result")["result"]
    assert result["chld"] == str(signal.SIG_IGN), result
    assert "spawn failed" not in (Path(spec.log_path).parent / "w.template.log").read_text()
