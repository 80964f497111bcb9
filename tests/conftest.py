"""Shared fixtures: one embedded PostgreSQL for the whole test session, a clean schema per test.

FAIRSCHED_DATABASE_URL, when set, points the tests at an existing server instead. Embedded
servers live in short folders under the temp dir that record the test process owning them;
servers left behind by a test run that was killed are stopped by the next run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import psutil
import psycopg
import pytest
from hypothesis import HealthCheck, settings

from fairsched.store.schema import TABLES, migrate

# Property tests check behaviour, not speed: a busy CI machine must not fail them on time.
settings.register_profile("fairsched", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("fairsched")

# Commands the tests start get Ctrl-C as at a terminal, even where the tests run with SIGINT
# ignored (inherited from a script that ignores it): a program started so leaves it ignored.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

SHORT_PREFIX = "fs-test-"  # short: a Unix socket path must stay under ~100 bytes


def _process_key(pid: int) -> list:
    return [pid, psutil.Process(pid).create_time()]


def _alive(key: list) -> bool:
    try:
        return abs(psutil.Process(key[0]).create_time() - key[1]) < 0.01
    except (psutil.Error, TypeError, IndexError):
        return False


def _exited(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def stop_servers_under(root: Path) -> None:
    """Fast-shutdown every PostgreSQL whose pgdata is inside root."""
    for pidfile in root.rglob("postmaster.pid"):
        try:
            pid = int(pidfile.read_text().split()[0])
            process = psutil.Process(pid)
            if "postgres" not in process.name() or _exited(pid):
                continue
            os.kill(pid, signal.SIGINT)
        except (OSError, ValueError, IndexError, psutil.Error):
            continue
        deadline = time.monotonic() + 20
        while not _exited(pid) and time.monotonic() < deadline:
            time.sleep(0.01)


def make_short_dir() -> Path:
    root = Path(tempfile.mkdtemp(prefix=SHORT_PREFIX))
    (root / "owner").write_text(json.dumps(_process_key(os.getpid())))
    return root


def remove_short_dir(root: Path) -> None:
    stop_servers_under(root)
    shutil.rmtree(root, ignore_errors=True)


def reap_abandoned_dirs() -> None:
    for root in Path(tempfile.gettempdir()).glob(SHORT_PREFIX + "*"):
        try:
            owner = json.loads((root / "owner").read_text())
        except (OSError, ValueError):
            continue
        if not _alive(owner):
            remove_short_dir(root)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


# Under pytest-xdist (`make test`) the longest tests are handed out first, so that none of them
# starts near the end and keeps one worker busy alone while the others have finished. Only the
# order changes: a name missing here costs time, not a test. (Of the packaging tests that
# share one build, the first goes first; the others find it built.)
SLOW_FIRST = (
    "tests/test_supervisor.py::test_stop_ps_and_a_timed_caller_give_up_on_a_supervisor_that_",
    "tests/test_packaging.py::test_a_first_make_run_says_each_step_in_one_line_then_supervises",
    "tests/test_packaging.py::test_the_sdist_holds_the_cython_sources_and_nothing_generated",
    "tests/test_chaos_drill.py::",
    "tests/test_supervisor_lifecycle.py::test_a_state_dir_deleted_under_a_running_supervisor",
    "tests/test_control_clients.py::test_clients_sending_megabytes_without_a_line_break",
    "tests/test_queue_supervisors.py::",
    "tests/test_core_agree.py::test_both_refuse_the_same_type_lists",
)


def _slow_rank(item) -> int:
    return next((rank for rank, prefix in enumerate(SLOW_FIRST)
                 if item.nodeid.startswith(prefix)), len(SLOW_FIRST))


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker collects; the controller deals
        items.sort(key=_slow_rank)  # stable: within a rank, the order of the files


@pytest.fixture(scope="session", autouse=True)
def _teardown_on_sigterm():
    """SIGTERM (as from `timeout`) ends the run through pytest's teardown, stopping servers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def short_tmp():
    """A short temp folder; PostgreSQL servers started inside are stopped afterwards."""
    root = make_short_dir()
    try:
        yield root
    finally:
        remove_short_dir(root)


@pytest.fixture(scope="module")
def _module_short_tmp():
    root = make_short_dir()
    try:
        yield root
    finally:
        remove_short_dir(root)


@pytest.fixture
def reused_state_dir(_module_short_tmp):
    """A state directory shared by the tests of one module, so initdb runs once: each test
    finds its embedded server stopped and no users recorded, and leaves it that way."""
    state = _module_short_tmp / "state"
    try:
        yield state
    finally:
        stop_servers_under(_module_short_tmp)
        (state / "pg.users.json").unlink(missing_ok=True)


def embedded_cluster(pgdata: Path):
    """fairsched's embedded PostgreSQL in pgdata, started (stopped by remove_short_dir)."""
    from fairsched.store.embedded import Cluster

    cluster = Cluster(pgdata)
    cluster.prepare()
    cluster.start()
    return cluster


@pytest.fixture(scope="session")
def database_url():
    url = os.environ.get("FAIRSCHED_DATABASE_URL")
    if url:
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
        yield url
        return
    reap_abandoned_dirs()
    root = make_short_dir()
    try:
        url = embedded_cluster(root / "pg").url()
        with psycopg.connect(url, autocommit=True) as conn:
            # Durability is not under test: skip the fsyncs that make every commit slow.
            conn.execute("ALTER SYSTEM SET fsync = off")
            conn.execute("ALTER SYSTEM SET synchronous_commit = off")
            conn.execute("SELECT pg_reload_conf()")
            migrate(conn)
        yield url
    finally:
        remove_short_dir(root)


@pytest.fixture
def db(database_url):
    """A clean job table: returns the URL of a migrated, empty database."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        # A connection a previous test left inside a transaction shows up as an error here.
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY")
    return database_url


def jobs_in(url: str) -> int:
    """How many jobs the table at url holds."""
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM fairsched_jobs").fetchone()[0]


def server_now(url: str):
    """The database server's clock now."""
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT now()").fetchone()[0]


def heartbeat_at(url: str, supervisor: int):
    """The last heartbeat of supervisor `supervisor`, by the server's clock."""
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT heartbeat_at FROM fairsched_supervisors WHERE id = %s",
                            (supervisor,)).fetchone()[0]


@pytest.fixture
def queue(db):
    """A fairsched.Queue on the clean database, over an autocommit connection of its own."""
    from fairsched.store.queue import Queue

    conn = psycopg.connect(db, autocommit=True)
    try:
        yield Queue(conn)
    finally:
        conn.close()


@pytest.fixture
def actor(db):
    """Run a supervisor's actor in this process: `actor(workers_toml, scenario, **options)`
    starts it on the clean database, awaits `scenario(actor)` and stops it (see
    tests/actor_harness.py)."""
    from tests.actor_harness import run_actor

    def run(workers, scenario, **options):
        run_actor(db, workers, scenario, **options)

    return run


@pytest.fixture
def supervisors(db):
    """Start real supervisors on the clean database; every one is stopped after the test.

    `supervisors(workers_toml, cls=Supervisor, **kwargs)`: see tests/supervisor_harness.py.
    """
    from tests.supervisor_harness import Supervisor

    started = []

    def make(workers, cls=Supervisor, **kwargs):
        sup = cls(db, workers, **kwargs)
        started.append(sup)
        return sup

    yield make
    for sup in started:
        sup.close()


@pytest.fixture(params=["c", "py"])
def core(request):
    """The scheduling core, once compiled and once as its pure-Python twin (ids c and py)."""
    from fairsched.core import compiled_error, implementations

    ns = implementations()[request.param]
    if ns is None:
        pytest.fail(f"compiled core did not load ({compiled_error()}): run `make build`")
    return ns
