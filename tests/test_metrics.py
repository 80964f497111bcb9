"""The Prometheus endpoint as a monitoring system scrapes it, from a real supervisor."""

import http.client
import json
import os
import re
import signal
import socket
import struct
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.supervisor_harness import wait_until

WORKERS = """
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:slow"
slots = 2

[[worker]]
name = "bad"
types = ["bad"]
handler = "sup_handlers:fail"
max_attempts = 2
retry_backoff = 0
"""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def scrape(port: int, host: str = "127.0.0.1") -> dict:
    """{(sample name, ((label, value), ...)): value} from one scrape of /metrics."""
    url = f"http://[{host}]:{port}/metrics" if ":" in host else f"http://{host}:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: dict, name: str, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def scrape_until(port: int, predicate, what: str, timeout: float = 10.0,
                 host: str = "127.0.0.1") -> dict:
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(port, host)
        if predicate(samples):
            return samples
        if time.monotonic() > deadline:
            shown = {k: v for k, v in samples.items() if not k[0].endswith("_bucket")}
            raise AssertionError(f"timed out waiting for {what}: {shown}")
        time.sleep(0.1)


def read_by(pid: int, port: int, client: tuple[str, int]) -> bool:
    """Whether process `pid` has accepted the connection from `client` to `port` on
    127.0.0.1 and read all that came on it (its receive queue, in /proc/net/tcp, is empty)."""
    if not any(c.raddr and tuple(c.raddr) == tuple(client) and c.laddr.port == port
               for c in psutil.Process(pid).net_connections(kind="tcp4")):
        return False
    with open("/proc/net/tcp") as table:
        for line in list(table)[1:]:
            local, remote, queues = line.split()[1], line.split()[2], line.split()[4]
            if (int(local.split(":")[1], 16), int(remote.split(":")[1], 16)) == (port, client[1]):
                return int(queues.split(":")[1], 16) == 0
    return False


def submit(sup, *args) -> None:
    result = sup.cli("submit", *args)
    assert result.returncode == 0, result.stderr


def test_counters_histograms_and_gauges_follow_the_jobs(supervisors):
    port = free_port()
    sup = supervisors(WORKERS, supervisor=f'metrics = "127.0.0.1:{port}"').start()
    assert f"metrics on http://127.0.0.1:{port}/metrics" in sup.output()
    head = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", method="HEAD")
    with urllib.request.urlopen(head, timeout=10) as response:  # a health check's request
        assert response.status == 200 and response.read() == b""

    # The slot gauges follow the actor within half a second: wait for the workers to show.
    idle = scrape_until(port, lambda s: value(s, "fairsched_queue_up") == 1
                        and value(s, "fairsched_slots", type="pdf", state="free") == 2,
                        "the queue depth and the free slots")
    assert value(idle, "fairsched_slots", type="pdf", state="free") == 2
    assert value(idle, "fairsched_slots", type="pdf", state="busy") == 0
    assert value(idle, "fairsched_workers", group="pdf", state="running") == 1
    assert value(idle, "fairsched_lease_lost") == 0
    assert value(idle, "fairsched_workers", group="bad", state="fatal") == 0
    assert value(idle, "fairsched_jobs_finished_total", type="pdf", outcome="succeeded") == 0
    assert value(idle, "fairsched_queue_jobs", type="pdf", status="pending") == 0
    assert value(idle, "fairsched_claim_losses_total") == 0

    for _ in range(3):
        submit(sup, "pdf", "--payload", '{"seconds": 0}')
    submit(sup, "bad")
    submit(sup, "pdf", "--delay", "3600")  # stays pending: counted in the depth, never run
    for _ in range(2):
        submit(sup, "pdf", "--on-demand", "--payload", '{"seconds": 0}')

    done = scrape_until(
        port, lambda s: value(s, "fairsched_jobs_finished_total", type="pdf", outcome="succeeded") == 5
        and value(s, "fairsched_queue_jobs", type="bad", status="failed") == 1
        and value(s, "fairsched_jobs_in_flight", type="pdf") == 0, "the jobs to finish")
    assert value(done, "fairsched_jobs_finished_total", type="pdf", outcome="succeeded") == 5
    assert value(done, "fairsched_jobs_finished_total", type="pdf", outcome="failed") == 0
    assert value(done, "fairsched_jobs_finished_total", type="bad", outcome="retried") == 1
    assert value(done, "fairsched_jobs_finished_total", type="bad", outcome="failed") == 1
    assert value(done, "fairsched_job_wait_seconds_count", type="pdf") == 5
    assert value(done, "fairsched_job_wait_seconds_count", type="bad") == 2
    assert value(done, "fairsched_job_run_seconds_count", type="pdf") == 5
    assert value(done, "fairsched_job_run_seconds_count", type="bad") == 2
    # Every job waits less than an hour, so it lands in the 3600 s bucket and below.
    assert value(done, "fairsched_job_wait_seconds_bucket", type="pdf", le="3600.0") == 5
    assert value(done, "fairsched_queue_jobs", type="pdf", status="pending") == 1
    assert value(done, "fairsched_queue_jobs", type="pdf", status="running") == 0
    assert value(done, "fairsched_queue_jobs", type="bad", status="pending") == 0
    # The one pending job is not eligible for an hour: nothing eligible has waited.
    assert value(done, "fairsched_queue_oldest_pending_seconds", type="pdf") == 0
    assert value(done, "fairsched_jobs_in_flight", type="pdf") == 0

    # One job from the queue and one on demand keep both slots of pdf-1 busy.
    submit(sup, "pdf", "--payload", '{"seconds": 30}')
    caller = sup.spawn_cli("submit", "pdf", "--on-demand", "--payload", '{"seconds": 30}')
    try:
        busy = scrape_until(
            port, lambda s: value(s, "fairsched_queue_jobs", type="pdf", status="running") == 1
            and value(s, "fairsched_slots", type="pdf", state="busy") == 2
            and value(s, "fairsched_jobs_in_flight", type="pdf") == 2, "busy slots")
        ps = sup.ps()
        assert [s["state"] for s in ps["slots"] if s["group"] == "pdf"] == ["busy", "busy"]
        assert value(busy, "fairsched_slots", type="pdf", state="free") == 0
        assert value(busy, "fairsched_jobs_in_flight", type="bad") == 0

        # No free slot: a new job waits, and the oldest eligible wait grows from its creation.
        submit(sup, "pdf", "--payload", '{"seconds": 0}')
        waiting = scrape_until(
            port, lambda s: value(s, "fairsched_queue_jobs", type="pdf", status="pending") == 2
            and value(s, "fairsched_queue_oldest_pending_seconds", type="pdf") > 0.2,
            "a waiting job")
        assert value(waiting, "fairsched_queue_oldest_pending_seconds", type="pdf") < 30

        pid = next(s["pid"] for s in ps["slots"] if s["group"] == "pdf")
        os.kill(pid, signal.SIGKILL)
        # Its two jobs end as retried attempts in the same step of the supervisor as the
        # restart: both counted, whichever a scrape sees first.
        crashed = scrape_until(
            port, lambda s: value(s, "fairsched_worker_restarts_total", group="pdf") >= 1
            and value(s, "fairsched_jobs_finished_total", type="pdf", outcome="retried") >= 2,
            "the restart and the two attempts retried")
        assert value(crashed, "fairsched_worker_restarts_total", group="pdf") == 1
        assert value(crashed, "fairsched_worker_restarts_total", group="bad") == 0
        assert value(crashed, "fairsched_jobs_finished_total", type="pdf", outcome="retried") == 2
    finally:
        caller.kill()
        caller.communicate()

    assert sup.cli("stop", "--timeout", "1").returncode == 0
    assert sup.wait_exit() == 0
    with pytest.raises(urllib.error.URLError):
        scrape(port)


def test_a_scrape_asking_for_some_metrics_by_name_gets_them(supervisors):
    # Prometheus sends `name[]` when a scrape job's `params` name the metrics it keeps.
    port = free_port()
    supervisors(WORKERS, supervisor=f'metrics = "127.0.0.1:{port}"').start()
    scrape_until(port, lambda s: value(s, "fairsched_queue_up") == 1
                 and value(s, "fairsched_workers", group="pdf", state="running") == 1,
                 "the queue depth and the workers")
    asked = ["fairsched_workers", "fairsched_slots", "fairsched_jobs_in_flight",
             "fairsched_on_demand_waiting", "fairsched_lease_lost", "fairsched_queue_jobs",
             "fairsched_queue_oldest_pending_seconds", "fairsched_queue_up",
             "fairsched_jobs_finished_total"]
    query = urllib.parse.urlencode([("name[]", name) for name in asked])
    url = f"http://127.0.0.1:{port}/metrics?{query}"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples = {s.name: s for family in text_string_to_metric_families(text)
               for s in family.samples}
    assert sorted(samples) == sorted(asked), text
    assert samples["fairsched_queue_up"].value == 1
    assert samples["fairsched_lease_lost"].value == 0


def test_an_ipv6_address_in_brackets_is_served(supervisors):
    try:
        port = free_port("::1")
    except OSError as exc:
        pytest.skip(f"this machine has no IPv6 loopback: {exc}")
    sup = supervisors(WORKERS, supervisor=f'metrics = "[::1]:{port}"').start()
    assert f"metrics on http://[::1]:{port}/metrics" in sup.output()
    scrape_until(port, lambda s: value(s, "fairsched_slots", type="pdf", state="free") == 2,
                 "the workers' slots", host="::1")
    with pytest.raises(urllib.error.URLError):  # IPv6 only: not on 127.0.0.1
        scrape(port)


def test_port_in_use_is_one_log_line_and_the_supervisor_runs_on(supervisors):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sup = supervisors(WORKERS, supervisor=f'metrics = "127.0.0.1:{port}"').start()
        result = sup.cli("submit", "pdf", "--on-demand", "--payload", '{"seconds": 0}')
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["slept"] == 0
    lines = [ln for ln in sup.output().splitlines() if "metrics" in ln]
    assert len(lines) == 1, lines
    assert f"cannot listen on 127.0.0.1:{port} (Address already in use)" in lines[0]
    assert "running without metrics" in lines[0]


def test_a_scrape_answers_while_the_database_is_silent(db):
    # A partition leaves the depth query hanging: the scrape still answers, within its
    # timeout, with the supervisor's own gauges and the depth said to be unknown.
    from tests.pg_proxy import PgProxy
    from tests.supervisor_harness import Supervisor

    proxy = PgProxy(db)
    port = free_port()
    sup = Supervisor(proxy.url_through, WORKERS, supervisor=f'metrics = "127.0.0.1:{port}"\n')
    try:
        sup.start()
        scrape_until(port, lambda s: value(s, "fairsched_queue_up") == 1, "the queue depth")
        proxy.cut()

        def asked_the_database():
            """A scrape's samples once one asked the silent database (those the depth's cache
            answered still say it is up); each answers within the scrape's bound."""
            began = time.monotonic()
            samples = scrape(port)
            assert time.monotonic() - began < 5
            return samples if value(samples, "fairsched_queue_up") == 0 else None

        samples = wait_until(asked_the_database, what="a scrape that asked the database")
        assert not any(name == "fairsched_queue_jobs" for name, _ in samples)
        assert value(samples, "fairsched_workers", group="pdf", state="running") == 1
        assert value(scrape(port), "fairsched_queue_up") == 0  # the next scrape too
        proxy.heal()
        scrape_until(port, lambda s: value(s, "fairsched_queue_up") == 1,
                     "the queue depth again", timeout=30)
        lines = [ln for ln in sup.output().splitlines() if "queue depth" in ln]
        assert "cannot read the queue depth: no answer from PostgreSQL within 2 s" in lines[0]
        assert "reading the queue depth again" in lines[-1]
    finally:
        sup.close()
        proxy.close()


def test_the_first_scrape_after_the_depth_connection_ended_reads_the_depth(supervisors, db):
    # As after a restart of PostgreSQL: the connection kept between scrapes is dead, and the
    # scrape that finds so connects again rather than saying the depth is unknown.
    import psycopg

    port = free_port()
    sup = supervisors(WORKERS, supervisor=f'metrics = "127.0.0.1:{port}"').start()
    scrape_until(port, lambda s: value(s, "fairsched_queue_up") == 1, "the queue depth")
    with psycopg.connect(db, autocommit=True) as conn:
        (ended,) = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                                " WHERE application_name = 'fairsched metrics'").fetchone()
    assert ended == 1

    def connected_again() -> bool:
        """Whether a scrape has read the depth on a new connection; none says it unknown."""
        assert value(scrape(port), "fairsched_queue_up") == 1
        with psycopg.connect(db, autocommit=True) as conn:
            (n,) = conn.execute("SELECT count(*) FROM pg_stat_activity"
                                " WHERE application_name = 'fairsched metrics'").fetchone()
        return n == 1

    wait_until(connected_again, what="a scrape past the depth's cache, connected again")
    assert "cannot read the queue depth" not in sup.output()


def test_the_depth_connection_keeps_the_keepalives_its_url_sets(db):
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from fairsched.supervisor.metrics import QueueDepth

    depth = QueueDepth(lambda: make_conninfo(db, keepalives_idle="42"))
    try:
        rows, up = depth.read()
        assert up == 1
        used = conninfo_to_dict(depth.conn.info.dsn)
        assert used["keepalives_idle"] == "42"  # the URL's, not the default's
        assert used["keepalives_count"] == "3"
    finally:
        depth.close()


def test_a_client_that_hangs_up_mid_request_leaves_the_log_alone(supervisors):
    # A scraper that resets its connection (a timeout on its side, a crash) is not news: no
    # traceback of the HTTP server lands among the log lines (JSON ones, say).
    port = free_port()
    sup = supervisors(WORKERS, supervisor=f'metrics = "127.0.0.1:{port}"').start()
    for request in (b"GET /metr", b"GET /metrics HTTP/1.1\r\nHost: x\r\n"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(request)
            # The server is reading the rest of the request: it has taken the connection
            # and what came on it so far.
            wait_until(lambda client=client: read_by(sup.proc.pid, port, client.getsockname()),
                       what="the server reading the request")
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    assert value(scrape(port), "fairsched_lease_lost") == 0  # it serves on
    assert sup.cli("stop").returncode == 0
    assert sup.wait_exit() == 0
    output = sup.output()
    assert "Traceback" not in output and "Exception occurred" not in output, output
    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ", line)
               for line in output.splitlines()), output


def test_a_connection_that_sends_nothing_is_closed(supervisors):
    # Each connection holds a thread and a file of the supervisor: one left idle, or whose
    # client vanished, must not hold them for good.
    port = free_port()
    supervisors(WORKERS, supervisor=f'metrics = "127.0.0.1:{port}"').start()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as idle, \
            socket.create_connection(("127.0.0.1", port), timeout=30) as halfway:
        halfway.sendall(b"GET /metrics HTTP/1.1\r\n")
        began = time.monotonic()
        assert idle.recv(1) == b""  # closed by the server
        assert halfway.recv(1) == b""
        assert 5 < time.monotonic() - began < 20
    assert value(scrape(port), "fairsched_lease_lost") == 0


def test_an_accept_header_the_exporter_cannot_read_gets_the_text_format(supervisors):
    # prometheus_client fails on some Accept headers; the scrape is answered all the same,
    # and no traceback lands among the log lines.
    port = free_port()
    sup = supervisors(WORKERS, supervisor=f'metrics = "127.0.0.1:{port}"').start()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={
        "Accept": "application/openmetrics-text; version=abc"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"fairsched_workers", "fairsched_jobs_finished"} <= names, names
    assert "Traceback" not in sup.output(), sup.output()


def test_head_gives_the_headers_of_get_and_other_paths_and_methods_are_refused(supervisors):
    port = free_port()
    supervisors(WORKERS, supervisor=f'metrics = "127.0.0.1:{port}"').start()
    scrape_until(port, lambda s: value(s, "fairsched_queue_up") == 1, "the queue depth")

    def ask(method: str, path: str) -> tuple[int, dict, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request(method, path)
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    status, got, body = ask("GET", "/metrics")
    assert status == 200 and b"fairsched_workers" in body
    status, head, empty = ask("HEAD", "/metrics")
    assert status == 200 and empty == b""
    assert head["Content-Type"] == got["Content-Type"]
    # The same metrics, a moment later: about the same length (the gauges' digits may differ).
    assert abs(int(head["Content-Length"]) - len(body)) < 200, (head, len(body))
    for path in ("/", "/foo", "/metrics/x", "/favicon.ico"):
        status, _, body = ask("GET", path)
        assert status == 404 and b"fairsched_workers" not in body, path
    for method in ("POST", "PUT", "DELETE"):
        status, headers, body = ask(method, "/metrics")
        assert status == 405 and headers["Allow"] == "GET, HEAD", method
        assert b"fairsched_workers" not in body


def slot_counts(samples: dict, job_type: str) -> dict:
    return {dict(labels)["state"]: v for (name, labels), v in samples.items()
            if name == "fairsched_slots" and dict(labels)["type"] == job_type}


def test_a_stopping_workers_slots_are_counted_as_ps_shows_them(supervisors):
    # `fairsched restart` of a worker whose job ignores the cancel: until it is killed, ps
    # shows its slots `stopping`, the job still on one; the gauges say the same.
    port = free_port()
    sup = supervisors(WORKERS, supervisor=f'metrics = "127.0.0.1:{port}"').start()
    submit(sup, "pdf", "--payload", '{"seconds": 30, "ignore_cancel": true}')
    scrape_until(port, lambda s: value(s, "fairsched_slots", type="pdf", state="busy") == 1,
                 "the job to start")
    assert sup.cli("restart", "pdf").returncode == 0
    ps = sup.wait_for(lambda ps: [s["state"] for s in sup_slots(ps)] == ["stopping", "stopping"],
                      timeout=5, what="pdf-1 stopping")
    assert any(s["job_id"] is not None for s in sup_slots(ps))
    stopping = scrape_until(
        port, lambda s: value(s, "fairsched_slots", type="pdf", state="stopping") == 2,
        "the slots stopping", timeout=1.5)  # the worker is killed 2 s after the restart
    assert slot_counts(stopping, "pdf") == {"free": 0, "busy": 0, "starting": 0,
                                            "stopping": 2, "down": 0, "fatal": 0}
    assert value(stopping, "fairsched_jobs_in_flight", type="pdf") == 1
    assert value(stopping, "fairsched_workers", group="pdf", state="stopping") == 1
    # The worker killed and back, the job returned to the queue runs on the new one.
    back = scrape_until(
        port, lambda s: value(s, "fairsched_jobs_finished_total", type="pdf",
                              outcome="returned") == 1
        and value(s, "fairsched_slots", type="pdf", state="busy") == 1, "the job to run again")
    assert slot_counts(back, "pdf") == {"free": 1, "busy": 1, "starting": 0, "stopping": 0,
                                        "down": 0, "fatal": 0}
    assert value(back, "fairsched_jobs_in_flight", type="pdf") == 1


def sup_slots(ps: dict, group: str = "pdf") -> list[dict]:
    return [s for s in ps["slots"] if s["group"] == group]


def test_an_on_demand_job_its_worker_refuses_counts_as_returned(supervisors):
    # As a refused queued job does: each start that the worker refuses ends as `returned`,
    # so the finished total, the run-time histogram and the wait histogram keep step.
    script = Path(__file__).parent / "handlers" / "garbage_worker.py"
    port = free_port()
    sup = supervisors(WORKERS + f"""
[[worker]]
name = "picky"
types = ["picky"]
command = ["{sys.executable}", "{script}", "picky"]
max_restarts = 1
""", supervisor=f'metrics = "127.0.0.1:{port}"').start()
    # Refused, restarted, refused again: the second refusal makes the worker fatal.
    result = sup.cli("submit", "picky", "--on-demand", "--payload", '{"refuse": true}',
                     timeout=30)
    assert result.returncode == 1 and "fatal" in result.stderr, result.stderr
    samples = scrape_until(port, lambda s: value(s, "fairsched_workers", group="picky",
                                                 state="fatal") == 1, "picky fatal")
    assert value(samples, "fairsched_job_wait_seconds_count", type="picky") == 2
    assert value(samples, "fairsched_jobs_finished_total", type="picky", outcome="returned") == 2
    assert value(samples, "fairsched_job_run_seconds_count", type="picky") == 2
    assert value(samples, "fairsched_jobs_in_flight", type="picky") == 0
    assert sup.ps()["supervisor"]["counters"]["returned"] == 2
    assert "job od-1 runs again (refused by its worker)" in sup.output()


def test_an_outcome_the_table_refuses_is_counted_unrecorded(supervisors, db):
    # Frozen past its lease while its job finishes, a supervisor counts the job succeeded when
    # it wakes; but another supervisor has taken the job over and counts its own run. The
    # outcome the table refused is counted apart, so the totals of both add up to the table's.
    import psycopg

    # The job ends before the lease watchdog (at 90% of the lease) kills its worker.
    settings = "lease = 3\nheartbeat_interval = 0.5\n"
    ports = free_port(), free_port()
    frozen = supervisors(WORKERS, supervisor=settings + f'metrics = "127.0.0.1:{ports[0]}"')
    frozen.start()
    other = supervisors(WORKERS, supervisor=settings + f'metrics = "127.0.0.1:{ports[1]}"')
    submit(frozen, "pdf", "--payload", '{"seconds": 1.2}')
    frozen.wait_for(lambda ps: any(s["job_id"] is not None for s in ps["slots"]),
                    what="the job running")
    frozen.signal(signal.SIGSTOP)
    other.start()  # started after the claim, so the job is the frozen one's
    try:  # the job ends meanwhile; the other supervisor takes it over and runs it again
        scrape_until(ports[1], lambda s: value(s, "fairsched_jobs_finished_total", type="pdf",
                                               outcome="succeeded") == 1,
                     "the other supervisor's run", timeout=30)
    finally:
        frozen.signal(signal.SIGCONT)
    frozen.wait_output("the outcome of 1 job was not recorded")
    mine = scrape_until(ports[0], lambda s: value(s, "fairsched_jobs_unrecorded_total",
                                                  type="pdf", outcome="succeeded") == 1,
                        "the refused outcome counted")
    assert value(mine, "fairsched_jobs_finished_total", type="pdf", outcome="succeeded") == 1
    assert frozen.ps()["supervisor"]["counters"]["unrecorded"] == 1
    theirs = scrape(ports[1])
    assert value(theirs, "fairsched_jobs_unrecorded_total", type="pdf", outcome="succeeded") == 0
    recorded = sum(value(s, "fairsched_jobs_finished_total", type="pdf", outcome="succeeded")
                   - value(s, "fairsched_jobs_unrecorded_total", type="pdf", outcome="succeeded")
                   for s in (mine, theirs))
    with psycopg.connect(db) as conn:
        (succeeded,) = conn.execute("SELECT count(*) FROM fairsched_jobs "
                                    "WHERE status = 'succeeded'").fetchone()
    assert recorded == succeeded == 1
