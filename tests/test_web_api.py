"""The web dashboard's JSON API over plain HTTP, without a browser: the token, GET that cannot
act, the errors, the pages that do not read, the token file. One supervisor for the module,
listening on every interface, so that reads need the token too."""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import stat
import time

import psycopg
import pytest

from fairsched.config import load_config
from fairsched.errors import ConfigError
from fairsched.store.schema import TABLES
from fairsched.web.app import MAX_STREAMS, TOKEN_FILE
from tests.accounts import as_stranger
from tests.supervisor_harness import Supervisor, free_port, wait_until

WORKERS = """
[[worker]]
name = "doomed"
handler = "sup_handlers:fail_permanently"
types = ["doomed"]
"""
# Slots enough for a frame of the slots to weigh some 100 KB: a page that does not read fills
# what the kernel and the dashboard would hold for it within seconds.
WIDE = """
[[worker]]
name = "wide"
handler = "sup_handlers:echo"
types = ["wide"]
slots = 200
"""


@pytest.fixture(scope="module")
def sup(database_url):
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY")
    s = Supervisor(database_url, WORKERS + WIDE, supervisor=f'web = "0.0.0.0:{free_port()}"\n')
    try:
        s.start()
        s.port = int(s.wait_output(r"web dashboard on http://0\.0\.0\.0:(\d+)/")[1])
        s.token = (s.dir / "state" / TOKEN_FILE).read_text().strip()
        yield s
    finally:
        s.close()


def call(sup, method: str, path: str, token: str | None = None) -> tuple[int, object]:
    conn = http.client.HTTPConnection("127.0.0.1", sup.port, timeout=10)
    try:
        conn.request(method, path, headers={"Authorization": f"Bearer {token}"} if token else {})
        resp = conn.getresponse()
        body = resp.read().decode()
        return resp.status, json.loads(body) if body.lstrip().startswith(("{", "[")) else body
    finally:
        conn.close()


def error(status: int, body) -> tuple[int, str]:
    """(status, the error's one line): the shape of every refusal."""
    assert isinstance(body, dict) and list(body) == ["error"], body
    assert "\n" not in body["error"]
    return status, body["error"]


def test_every_read_and_action_needs_the_token_off_loopback_and_get_cannot_act(sup):
    job = sup.enqueue("doomed", payload={"why": "bad input"})
    sup.wait_for(lambda ps: ps["supervisor"]["counters"]["failed"] == 1, what="the job to fail")
    for method, path in (("GET", "/api/ps"), ("GET", "/api/jobs"), ("GET", f"/api/jobs/{job}"),
                         ("GET", "/api/counts"), ("POST", f"/api/jobs/{job}/retry"),
                         ("POST", f"/api/jobs/{job}/cancel"),
                         ("POST", "/api/workers/doomed/restart")):
        for token in (None, "x" * len(sup.token), sup.token[:-1]):
            status, message = error(*call(sup, method, path, token))
            assert status == 401, (method, path, token)
            assert message.startswith("the dashboard's token is needed")
    assert call(sup, "GET", "/")[0] == 200  # the page itself holds no data
    status, ps = call(sup, "GET", "/api/ps", sup.token)
    assert status == 200
    assert [(s["worker"], s["pid"]) for s in ps["slots"]] == [
        (s["worker"], s["pid"]) for s in sup.ps()["slots"]]
    assert ps["slots"][0]["rss"] > 0  # as ps --json has it
    status, jobs = call(sup, "GET", "/api/jobs?status=failed", sup.token)
    cli = sup.cli("jobs", "--status", "failed", "--json")
    assert (status, jobs) == (200, json.loads(cli.stdout))
    assert jobs[0]["last_error"] == "PermanentError: bad input"
    # GET never acts: the routes of actions answer it 405, and the job stays failed.
    assert error(*call(sup, "GET", f"/api/jobs/{job}/retry", sup.token)) == (
        405, f"Method Not Allowed: GET /api/jobs/{job}/retry")
    assert error(*call(sup, "GET", "/api/workers/doomed/restart", sup.token))[0] == 405
    assert call(sup, "GET", f"/api/jobs/{job}", sup.token)[1]["status"] == "failed"
    assert error(*call(sup, "POST", "/api/ps", sup.token))[0] == 405
    assert error(*call(sup, "GET", "/api/nothing", sup.token)) == (
        404, "Not Found: GET /api/nothing")


def test_bad_ids_and_values_are_one_line_errors(sup):
    job = sup.enqueue("doomed")
    sup.wait_for(lambda ps: ps["supervisor"]["counters"]["failed"] >= 1, what="a failed job")
    t = sup.token
    assert error(*call(sup, "POST", "/api/jobs/abc/retry", t)) == (
        400, "a job id is an integer from 1, got 'abc'")
    assert error(*call(sup, "POST", "/api/jobs/0/cancel", t))[0] == 400
    assert error(*call(sup, "POST", "/api/jobs/99999999999999999999/retry", t))[0] == 400
    assert error(*call(sup, "GET", "/api/jobs/987654", t)) == (404, "no job with id 987654")
    assert error(*call(sup, "POST", "/api/jobs/987654/retry", t)) == (404, "no job with id 987654")
    assert error(*call(sup, "POST", f"/api/jobs/{job}/cancel", t)) == (
        409, f"job {job} already failed; only unfinished jobs can be cancelled")
    assert error(*call(sup, "POST", "/api/workers/nobody/restart", t)) == (
        404, "no worker or group named 'nobody' (known: doomed, doomed-1, wide, wide-1)")
    assert error(*call(sup, "GET", "/api/jobs?status=lost", t))[1].startswith(
        "status must be one of pending")
    assert error(*call(sup, "GET", "/api/jobs?limit=0", t)) == (
        400, "limit must be an integer from 1 to 1000, got '0'")
    assert error(*call(sup, "GET", "/api/jobs?type=a%20b", t))[0] == 400
    assert call(sup, "POST", f"/api/jobs/{job}/retry", t) == (200, {"id": job, "status": "pending"})
    sup.wait_output(rf"web: job {job} retried \(doomed\)")


def stream_request(sup) -> bytes:
    return (f"GET /api/ps/stream HTTP/1.1\r\nHost: 127.0.0.1:{sup.port}\r\n"
            f"Authorization: Bearer {sup.token}\r\n\r\n").encode()


def open_stream(sup, reads: bool = False, source: str = "127.0.0.1") -> socket.socket:
    """A page following the slots that reads its response's head, and then nothing (unless
    it `reads`: then its receive buffer is not made small), from the loopback address
    `source`."""
    s = socket.create_connection(("127.0.0.1", sup.port), timeout=10, source_address=(source, 0))
    if not reads:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(stream_request(sup))
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    assert head.startswith(b"HTTP/1.1 200"), head
    return s


def test_pages_that_do_not_read_or_vanish_do_not_stop_the_others(sup):
    stuck = [open_stream(sup) for _ in range(5)]
    try:
        # The cap first, while the pages that do not read are followed still (each is
        # dropped SEND_WITHIN seconds after the first frame it did not take), and before
        # any page hangs up (followed until a frame finds it gone).
        more = [open_stream(sup) for _ in range(MAX_STREAMS - len(stuck) - 1)]
        reader = open_stream(sup, reads=True)
        stuck.append(reader)  # closed with them, whatever happens
        try:
            status, message = error(*call(sup, "GET", "/api/ps/stream", sup.token))
            assert (status, message) == (503, f"{MAX_STREAMS} pages follow the slots already; "
                                              "try again")
        finally:
            for s in more:
                s.close()
        for _ in range(3):  # some that hang up at once
            gone = socket.create_connection(("127.0.0.1", sup.port), timeout=10)
            gone.sendall(stream_request(sup))
            gone.close()
        reader.settimeout(3)  # a frame a second
        data, started = b"", time.monotonic()
        while data.count(b"event: ps\n") < 3:
            data += reader.recv(65536)
        assert time.monotonic() - started < 6
        started = time.monotonic()
        assert sup.ps()["slots"] and time.monotonic() - started < 2  # the control socket too
    finally:
        for s in stuck:
            s.close()
    assert call(sup, "GET", "/api/ps", sup.token)[0] == 200


def test_a_page_that_does_not_read_is_dropped(sup):
    # From an address of its own: another test's page dropped meanwhile is not this one.
    said = "web: dropped a page at 127.0.0.9 that took no frame for 5 s"
    before = sup.output().count(said)
    stuck = open_stream(sup, source="127.0.0.9")
    try:
        wait_until(lambda: sup.output().count(said) > before, 30, what="the page dropped")
        # Reset: what was held for it is dropped, not sent.
        stuck.settimeout(10)
        with pytest.raises(ConnectionResetError):
            while stuck.recv(1 << 20):
                pass
    finally:
        stuck.close()
    assert call(sup, "GET", "/api/ps", sup.token)[0] == 200


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except PermissionError:
        return "EACCES"


def test_the_generated_token_is_private_and_kept(sup):
    path = sup.dir / "state" / TOKEN_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(sup.token) >= 40
    assert as_stranger(_read, str(path)) == "EACCES"
    from fairsched.web.app import load_token

    settings = load_config(sup.config).supervisor
    assert load_token(settings) == sup.token  # never written again
    assert path.read_text().strip() == sup.token


@pytest.mark.parametrize(("line", "problem"), [
    ('web = "8787"', "key 'web' must look like 'host:port'"),
    ('web = "127.0.0.1:0"', "key 'web' must look like 'host:port' or '[ipv6]:port' (a host, and "
                            "a port 1 to 65535), got '127.0.0.1:0'"),
    ('web = ":8787"', "key 'web' must look like 'host:port'"),
    ('web = "127.0.0.1:65536"', "key 'web' must look like 'host:port'"),
    ('web_token = "short"', "key 'web_token' must be at least 16 printable ASCII characters"),
])
def test_a_bad_web_setting_is_one_line_naming_the_key(tmp_path, line, problem):
    config = tmp_path / "workers.toml"
    config.write_text(f"[supervisor]\n{line}\n" + WORKERS.replace("sup_handlers:", "x:"))
    with pytest.raises(ConfigError) as refused:
        load_config(config)
    assert f"[supervisor] {problem}" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_web_token_in_a_file_others_can_read_is_refused(tmp_path):
    config = tmp_path / "workers.toml"
    config.write_text('[supervisor]\nweb = "127.0.0.1:8787"\nweb_token = "'
                      + "t" * 32 + '"\n' + WORKERS.replace("sup_handlers:", "x:"))
    for mode in (0o644, 0o640):
        config.chmod(mode)
        with pytest.raises(ConfigError) as refused:
            load_config(config)
        assert str(refused.value).endswith(
            f"[supervisor] key 'web_token' is a secret in a file other accounts can read (mode "
            f"{mode:04o}): `chmod 600` it, or leave web_token out for the token generated into "
            "state_dir"), refused.value
    config.chmod(0o600)
    assert load_config(config).supervisor.web_token == "t" * 32


def test_a_taken_port_stops_the_start_in_one_line(database_url):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        s = Supervisor(database_url, WORKERS, supervisor=f'web = "127.0.0.1:{port}"\n')
        try:
            s.start(wait=False)
            assert s.wait_exit() == 1
            assert (f"[supervisor] web: cannot listen on 127.0.0.1:{port}: Address already in use"
                    in s.output())
            assert not re.search(r"supervisor \d+ started", s.output())
        finally:
            s.close()
    assert not os.path.exists(s.dir)
