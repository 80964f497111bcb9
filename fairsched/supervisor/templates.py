"""Pre-loaded templates: one process per Python handler group that has imported the handler
once and forks that group's workers, first and replacements alike, so that no start pays the
imports again. Owned by the workers component (workers.py), whose processes they fork."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import os
import signal
import time
from pathlib import Path

from fairsched.backoff import backoff
from fairsched.config import Config, SupervisorSettings
from fairsched.permissions import make_private_folder
from fairsched.supervisor.process import WorkerProcess
from fairsched.supervisor.states import EXITED, ProcessState
from fairsched.supervisor.template_process import StartsCold, Template, TemplateGone
from fairsched.worker.launch import LaunchError, LaunchSpec, become_subreaper

log = logging.getLogger("fairsched.supervisor")

TEMPLATE_DELAY_FIRST = 1.0  # seconds before a lost template is replaced; doubles per recent loss
TEMPLATE_DELAY_MAX = 60.0
TEMPLATE_CALM = 600.0  # seconds after which a template's losses are forgotten


def launch_spec(proc: WorkerProcess, log_dir: Path, settings: SupervisorSettings) -> LaunchSpec:
    spec = proc.spec
    return LaunchSpec(name=proc.name, group=spec.name, types=spec.types, slots=spec.slots,
                      handler=spec.handler, command=spec.command, cwd=spec.cwd,
                      log_path=log_dir / f"{proc.name}.log", env=dict(spec.env),
                      log_max_bytes=settings.log_max_bytes, log_backups=settings.log_backups)


def start_templates(config: Config) -> dict[str, Template]:
    """Start the template of every Python handler group, by group name; returns at once.

    Called before the supervisor imports the rest of itself (the database driver alone takes
    about 100 ms), so that on a second core the handlers import meanwhile. The supervisor
    adopts them in `Templates.start_all`; a group missing here gets its template there, or starts
    cold.
    """
    become_subreaper()  # before any template forks a worker
    log_dir = config.supervisor.state_dir / "logs"
    make_private_folder(log_dir)
    templates = {}
    for spec in config.workers:
        if spec.handler is not None:
            try:
                templates[spec.name] = Template.start(
                    launch_spec(WorkerProcess(spec, 1), log_dir, config.supervisor))
            except OSError as exc:
                log.debug("no template for %s: %s", spec.name, exc)
    return templates


class Templates:
    """Owns the templates by group: those ready, those still importing their handler, their
    pids, the spawns each has under way, the losses that space out their replacements, and
    why a group's template could not import its handler."""

    def __init__(self, workers, config: Config, loop, run, log_dir: Path):
        self.workers = workers
        self.config = config
        self.loop = loop
        self.run = run  # RunState: the actor's, read only
        self.log_dir = log_dir
        self.templates: dict[str, Template] = {}
        self.template_pids: dict[int, str] = {}
        self.warming_up: dict[str, Template] = {}  # templates still importing their handler
        self.template_losses: dict[str, list[float]] = {}  # monotonic times, by group
        # Groups whose template could not import the handler: why, said when one of their
        # workers, importing it itself, is ready after all (else that worker says what failed).
        self.import_failed: dict[str, str] = {}
        self.template_timers: dict[str, asyncio.TimerHandle] = {}  # replacements due
        self.pending_spawns: dict[str, collections.deque] = {}

    # -- what the workers ask --------------------------------------------------------------------

    def warming(self, group: str) -> bool:
        """Whether the group's template is still importing its handler (its workers start
        when it is ready)."""
        return group in self.warming_up

    def fork(self, proc: WorkerProcess, spec: LaunchSpec):
        """Have the group's template fork `proc`: the worker's socket, or None when it has none
        (or it failed: its workers start cold from here on)."""
        template = self.templates.get(proc.group)
        if template is None:
            return None
        try:
            sock = template.begin_spawn(spec, proc.life.name)
        except LaunchError as exc:  # the template's own failure; any other OSError (the
            # worker's log cannot be opened, say) would stop a cold start too
            log.warning("template for %s failed (%s); starting %s cold", proc.group, exc,
                        proc.name)
            self._drop_template(template)
            return None
        self.pending_spawns[proc.group].append((proc, proc.life.name))
        return sock

    def spawns_pending(self) -> bool:
        return any(self.pending_spawns.values())

    def reaped(self, pid: int) -> bool:
        """Whether `pid`, just reaped, was a template."""
        group = self.template_pids.pop(pid, None)
        if group is None:
            return False
        # What its handler's import started (a helper process, say) goes with it, as what a
        # job starts goes with its worker: the workers it forked lead their own.
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        template = self.templates.get(group)
        if template is not None and template.pid == pid:
            self._drop_template(template)
        return True

    def kill(self, group: str) -> bool:
        """Kill the group's template, stuck on a spawn; its pending spawns start cold. False
        when it has none."""
        template = self.templates.get(group)
        if template is None:
            return False
        template.kill()
        self._drop_template(template, why_said=True)
        return True

    def imported_by_worker(self, group: str) -> str | None:
        """A worker of `group` is ready: why its template could not import the handler, if it
        could not (the worker imported it all the same), said once."""
        return self.import_failed.pop(group, None)

    def keep_for_shutdown(self, templates: dict[str, Template]) -> None:
        """Templates started before a supervisor that stops before any worker starts: for the
        shutdown to stop."""
        for template in templates.values():
            self.warming_up[template.group] = template

    def close_all(self) -> None:
        """Shutting down: every template goes, with what its import started."""
        for template in [*self.templates.values(), *self.warming_up.values()]:
            self._drop_template(template)
        for pid in self.template_pids:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)

    # -- starting and replacing them -----------------------------------------------------------

    def start_all(self, templates: dict[str, Template] | None = None) -> None:
        """Start every worker: one pre-loaded template per Python handler group, so that its
        workers, first and replacements alike, are forked with the handler already imported.
        The templates import in parallel and the loop goes on meanwhile (a slow import holds
        up only its own group); a group whose template fails starts cold. `templates` are
        the ones start_templates began already."""
        templates = dict(templates or {})
        for spec in self.config.workers:
            if not self._warm_template(spec, templates.pop(spec.name, None)):
                for proc in self.workers.procs:
                    if proc.spec is spec:
                        self.workers.spawn_worker(proc)

    def _warm_template(self, spec, template: Template | None = None) -> bool:
        """Have a new template import the group's handler (`template`, when one was started
        already); its DOWN workers start once it is ready. False for a group without one."""
        procs = [p for p in self.workers.procs if p.spec is spec]
        if template is None and spec.handler is not None:
            try:
                template = Template.start(launch_spec(procs[0], self.log_dir,
                                                      self.config.supervisor))
            except OSError as exc:
                log.debug("no template for %s: %s", spec.name, exc)
        if template is None:
            return False
        # Whoever closes its socket (a failure found inside Template, too), the loop lets
        # go of the number first: a reader left behind would deafen the next file given it.
        template.before_close = functools.partial(self.loop.remove_reader, template.fd)
        self.template_pids[template.pid] = template.group
        self.warming_up[template.group] = template
        log.info("template for %s is importing %s; its workers start once it is ready",
                 spec.name, spec.handler)
        self.loop.create_task(self._warm_up(template, procs), name=f"template-{spec.name}")
        return True

    def reload(self, spec) -> None:
        """Replace the group's template with one that imports the handler afresh: the code as
        it is now, for the workers started from here on (`fairsched restart`)."""
        if spec.handler is None or self.run.shutting_down:
            return
        self.drop_group(spec.name)  # one importing started over: the code may have changed
        self._warm_template(spec)

    def drop_group(self, group: str) -> None:
        """The group's template goes (and one importing, or due): a reload removed the group,
        or one takes its place. Spawns it had under way start cold."""
        timer = self.template_timers.pop(group, None)
        if timer is not None:
            timer.cancel()
        importing = self.warming_up.pop(group, None)
        if importing is not None:
            importing.kill()
        template = self.templates.pop(group, None)
        if template is not None:
            self._drop_template(template)

    async def _warm_up(self, template: Template, procs: list[WorkerProcess]) -> None:
        answered = self.loop.create_future()
        self.loop.add_reader(template.fileno(), lambda: answered.done() or answered.set_result(1))
        try:
            await asyncio.wait_for(answered, procs[0].spec.start_timeout)
            template.wait_ready(timeout=1.0)  # the answer is there: this does not block
            ready = True
        except TimeoutError:
            log.warning("template for %s did not import %s within %g s (start_timeout); "
                        "killing it, its workers start cold", template.group, template.handler,
                        procs[0].spec.start_timeout)
            template.kill()
            ready = False
        except StartsCold as exc:  # its workers will run, but the operator should know why
            log.warning("%s", exc)
            ready = False
        except TemplateGone as exc:  # killed while importing (the OOM killer, say)
            if self.warming_up.get(template.group) is template and not self.run.shutting_down:
                log.warning("%s; %s", exc, self._replacing_template(template, "its workers"))
            ready = False
        except OSError as exc:  # the cold path reports the real problem
            log.debug("no template for %s: %s", template.group, exc)
            self.import_failed[template.group] = str(exc)
            ready = False
        finally:
            self.loop.remove_reader(template.fd)
        if self.warming_up.get(template.group) is not template:
            template.close()  # replaced by a newer template (restart), which starts the workers
            return
        del self.warming_up[template.group]
        if not ready or self.run.shutting_down:
            template.close()
        else:
            self.import_failed.pop(template.group, None)
            self.templates[template.group] = template
            self.pending_spawns[template.group] = collections.deque()
            self.loop.add_reader(template.fileno(), self._on_template_reply, template)
        for proc in procs:
            # Not one waiting out a crash's backoff: its timer starts it.
            if (proc.state is ProcessState.DOWN and proc.life.pid is None
                    and proc.restart_timer is None):
                self.workers.spawn_worker(proc)
        self.workers.rolling.step()  # a reload waited for the new code to be imported

    def _on_template_reply(self, template: Template) -> None:
        pending = self.pending_spawns.get(template.group)
        while True:
            reply = template.read_reply()
            if reply == {}:
                return
            if reply is None:
                self._drop_template(template)
                return
            if not pending:
                continue
            proc, incarnation = pending.popleft()
            if proc.life.name != incarnation or proc.state in EXITED:
                # A later start's; or this start's worker came and went already (its hello
                # named its pid, its exit was reaped): this pid is no process of ours now.
                continue
            pid = reply.get("pid")
            if not isinstance(pid, int) or pid <= 0:
                log.warning("template for %s could not start %s: %s; starting it cold",
                            template.group, proc.name, reply.get("error"))
                self.workers.relaunch_cold(proc)
                continue
            self.workers.learn_pid(proc, pid)

    def _drop_template(self, template: Template, *, why_said: bool = False) -> None:
        template.close()  # its before_close lets the loop go of its socket
        if self.templates.get(template.group) is template:
            del self.templates[template.group]
            if not self.run.shutting_down:
                what_next = self._replacing_template(template, "replacements")
                if not why_said:
                    log.warning("template for %s exited; %s", template.group, what_next)
        pending = self.pending_spawns.pop(template.group, collections.deque())
        for proc, incarnation in pending:
            if proc.life.name == incarnation and proc.life.pid is None:
                self.workers.relaunch_cold(proc)

    def _replacing_template(self, template: Template, starting: str) -> str:
        """Have a lost template replaced, unless every worker of its group is fatal: none
        would be forked from it, and `fairsched restart` starts a new one. What happens, in
        words for the log."""
        if self._group_fatal(template.group):
            return (f"its workers are fatal: a new one imports {template.handler} on "
                    f"`fairsched restart {template.group}`")
        return (f"{starting} start cold until a new one has imported {template.handler} "
                f"(in {self._replace_template_later(template.group):g} s)")

    def _group_fatal(self, group: str) -> bool:
        return all(p.state is ProcessState.FATAL for p in self.workers.procs if p.group == group)

    def _replace_template_later(self, group: str) -> float:
        """Start a new template for `group` after a delay that doubles with each loss in the
        last TEMPLATE_CALM seconds (1 s, 2 s, ... up to a minute): a template killed once (by
        the OOM killer, say) is back at once, one that keeps dying does not spin."""
        now = time.monotonic()
        losses = [t for t in self.template_losses.get(group, []) if now - t < TEMPLATE_CALM]
        losses.append(now)
        self.template_losses[group] = losses
        delay = backoff(len(losses) - 1, TEMPLATE_DELAY_FIRST, TEMPLATE_DELAY_MAX)
        timer = self.template_timers.pop(group, None)
        if timer is not None:
            timer.cancel()
        self.template_timers[group] = self.loop.call_later(delay, self._replace_template, group)
        return delay

    def _replace_template(self, group: str) -> None:
        self.template_timers.pop(group, None)
        if (self.run.shutting_down or group in self.templates or group in self.warming_up
                or self._group_fatal(group)):  # gone fatal meanwhile: restart brings one
            return
        spec = next(p.spec for p in self.workers.procs if p.group == group)
        self._warm_template(spec)
