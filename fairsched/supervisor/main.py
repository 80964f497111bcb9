"""Run one supervisor in the foreground until it is stopped; returns the process exit code."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal

from fairsched.config import Config
from fairsched.errors import path_name
from fairsched.logs import first_line
from fairsched.supervisor.control import ControlServer
from fairsched.supervisor.log_rotation import LogRotation
from fairsched.supervisor.states import IGNORED_SIGNALS, RELOAD_SIGNALS, STOP_SIGNALS
from fairsched.supervisor.templates import start_templates
from fairsched.web import WebError

log = logging.getLogger("fairsched.supervisor")


def run_supervisor(config: Config) -> int:
    # Until the loop handles them, signals are noted here and acted on once it does: a stop
    # that comes while the supervisor starts is not lost, nor does it kill it outright.
    early: list[int] = []
    for sig in STOP_SIGNALS + RELOAD_SIGNALS + IGNORED_SIGNALS:
        signal.signal(sig, lambda signum, frame: early.append(signum))
    _raise_file_limit()
    _keep_inherited_files()
    config.make_state_dir()
    control = ControlServer(config.control_socket)
    control.lock()  # raises AlreadyRunning: exit 2 before anything starts
    templates = start_templates(config)
    # Imported only now: the handlers import in their templates meanwhile (psycopg takes
    # about 100 ms, as long as a typical handler's imports).
    import psycopg

    from fairsched.store.database import chosen_url, note_database_kind
    from fairsched.store.errors import StoreError
    from fairsched.supervisor.actor import Supervisor

    # A URL that is not one: exit 2, no worker started.
    url = chosen_url(config.supervisor.database, config.path)
    note_database_kind(config.supervisor.state_dir, external=bool(url))

    sup = None

    async def main() -> int:
        nonlocal sup
        settings = config.supervisor
        rotation = LogRotation(settings.state_dir / "logs", settings.log_max_bytes,
                               settings.log_backups)
        rotation.start(asyncio.get_running_loop())  # the templates write already
        observer = None
        if config.supervisor.metrics:
            from fairsched.supervisor.metrics import PrometheusObserver

            observer = PrometheusObserver(config.supervisor.metrics)
        sup = Supervisor(config, observer, early_signals=early)
        try:
            try:
                await sup.start(templates)
            except psycopg.Error as exc:
                log.error("cannot use the database: %s", first_line(exc))
                await sup.shutdown(0)
                return 1
            except StoreError:  # no database at all: stop the workers, the CLI says why
                await sup.shutdown(0)
                raise
            except WebError as exc:  # the web dashboard cannot listen, or has no token
                log.error("%s", exc)
                await sup.shutdown(0)
                return 1
            try:
                await control.start(sup)
            except OSError as exc:
                log.error("cannot listen on %s: %s", path_name(control.path), exc)
                await sup.shutdown(0)
                return 1
            await sup.stopped.wait()
            return 1 if sup.queue.unrecorded else 0  # what jobs did was lost: say so
        finally:
            rotation.stop()
            await control.close()
            sup.release_signals()

    return asyncio.run(main())


def _keep_inherited_files() -> None:
    """Make what the supervisor inherited beyond stdin, stdout and stderr (a shell's pipe,
    say) its own: a worker holding the write end of its starter's pipe would keep that
    reader waiting for an EOF. The supervisor's own files are not inheritable already."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: nothing to learn the descriptors from
        return
    for fd in fds:
        if fd > 2:
            with contextlib.suppress(OSError):  # the listing's own, closed by now
                os.set_inheritable(fd, False)


def _raise_file_limit() -> None:
    """Let the supervisor open as many files as the hard limit allows (up to 65536): each
    worker takes a socket and a log file, each control connection one more."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as exc:
            log.debug("cannot raise the open file limit: %s", exc)
