"""`--socket` naming something that is no supervisor's control socket: one line, exit 1."""

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest


@contextlib.contextmanager
def answering(reply: bytes, name: str = "sock"):
    """A Unix socket whose server reads a request line and answers every one with `reply`."""
    folder = Path(tempfile.mkdtemp(prefix="fs-", dir="/tmp"))
    path = folder / name
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    server.settimeout(0.05)  # a closed socket does not wake accept(): look at `stop` often
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(10)
            with conn:
                conn.recv(65536)
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        stop.set()
        server.close()
        thread.join(5)
        path.unlink(missing_ok=True)
        folder.rmdir()


def fairsched(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "FAIRSCHED_CONFIG"}
    return subprocess.run([sys.executable, "-m", "fairsched", *args], capture_output=True,
                          text=True, env=env, timeout=60)


COMMANDS = [["ps"], ["ps", "--json"], ["restart", "pdf"], ["stop"], ["submit", "pdf", "--on-demand"]]
REPLIES = {
    "bytes": b"\xff\xfe\x00garbage\n",
    "text": b"HTTP/1.1 400 Bad Request\r\n\r\n",
    "a list": b"[1, 2]\n",
    "a string": b'"ok"\n',
    "an object without it": b'{"ok": true}\n',
    "a table of the wrong shape": b'{"ps": {"slots": {}}}\n',
}


@pytest.mark.parametrize("reply", REPLIES.values(), ids=REPLIES.keys())
@pytest.mark.parametrize("command", COMMANDS)
def test_a_socket_that_answers_as_no_supervisor_does_is_one_line_exit_1(command, reply):
    with answering(reply) as path:
        result = fairsched(*command, "--socket", str(path))
    assert (result.returncode, result.stdout) == (1, ""), (result.returncode, result.stdout,
                                                           result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"fairsched: {path}") or f"on {path}" in lines[0], lines[0]
    assert "supervisor" in lines[0], lines[0]


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != ["stop"]])
def test_a_socket_path_with_a_line_break_and_no_supervisor_is_spelled_on_one_line(command):
    path = "/tmp/fs-no-such-folder/x\ny"
    result = fairsched(*command, "--socket", path)
    assert (result.returncode, result.stdout) == (1, ""), (result.returncode, result.stderr)
    assert result.stderr == (f"fairsched: no supervisor is running on {path!r} (start one with "
                             "`fairsched supervise --config ...`)\n"), result.stderr


def test_stop_with_no_supervisor_running_is_done_already_exit_0_saying_so(tmp_path):
    # As `systemctl stop` of a stopped unit: stopped is what was asked for. It was exit 1,
    # which a script stopping fairsched before an upgrade took for a failure.
    path = "/tmp/fs-no-such-folder/x\ny"
    result = fairsched("stop", "--socket", path)
    assert (result.returncode, result.stdout) == (0, ""), (result.returncode, result.stderr)
    assert result.stderr == (f"fairsched: no supervisor is running on {path!r}: nothing to "
                             "stop\n"), result.stderr
    config = tmp_path / "workers.toml"
    config.write_text('[[worker]]\nname = "pdf"\ntypes = ["pdf"]\nhandler = "h:f"\n')
    result = fairsched("stop", "--config", str(config))
    assert (result.returncode, result.stdout) == (0, ""), (result.returncode, result.stderr)
    assert result.stderr == (f"fairsched: no supervisor is running on "
                             f"{tmp_path / '.fairsched' / 'control' / 'sock'}: nothing to stop\n")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_socket_path_with_a_line_break_answering_as_no_supervisor_is_one_line(command):
    with answering(b"[1, 2]\n", name="so\nck") as path:
        result = fairsched(*command, "--socket", str(path))
    assert (result.returncode, result.stdout) == (1, ""), (result.returncode, result.stderr)
    assert result.stderr == (f"fairsched: {str(path)!r} is not a fairsched supervisor's control "
                             "socket: it answered '[1, 2]'\n"), result.stderr
