"""`fairsched submit TYPE --payload -` as a user meets it: typed at a terminal, or piped in."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys

from tests.test_cli_queue import WORKERS_TOML, queue

HINT = ("reading the payload's JSON from standard input: end it with Ctrl-D at the start of "
        "a line\n")


def submit_command(db, tmp_path) -> tuple[list[str], dict]:
    config = tmp_path / "workers.toml"
    config.write_text(WORKERS_TOML)
    env = {k: v for k, v in os.environ.items() if k != "FAIRSCHED_CONFIG"}
    env["FAIRSCHED_DATABASE_URL"] = db
    return ([sys.executable, "-m", "fairsched", "submit", "pdf", "--payload", "-", "--config",
             str(config)], env)


def test_payload_typed_at_a_terminal_is_asked_for_with_how_to_end_it(db, tmp_path):
    args, env = submit_command(db, tmp_path)
    master, slave = pty.openpty()
    with subprocess.Popen(args, env=env, stdin=slave, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as proc:
        os.close(slave)
        try:
            # Said while it waits for the payload, not after.
            assert select.select([proc.stderr], [], [], 30)[0], "nothing said while waiting"
            assert proc.stderr.readline().decode() == HINT
            os.write(master, b'{"pages": 3}\n\x04')
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
            os.close(master)
    assert (proc.returncode, err.decode()) == (0, ""), err
    with queue(db) as q:
        assert q.get_job(int(out))["payload"] == {"pages": 3}


def test_payload_piped_in_is_read_without_a_word(db, tmp_path):
    args, env = submit_command(db, tmp_path)
    result = subprocess.run(args, input='{"pages": 4}', env=env, capture_output=True,
                            text=True, timeout=60)
    assert (result.returncode, result.stderr) == (0, "")
    with queue(db) as q:
        assert q.get_job(int(result.stdout))["payload"] == {"pages": 4}


def test_payload_from_a_closed_standard_input_is_one_line_exit_2(db, tmp_path):
    # As from `fairsched submit pdf --payload - <&-` in a shell, or a service with no stdin.
    args, env = submit_command(db, tmp_path)
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60,
                            preexec_fn=lambda: os.close(0))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == ("fairsched: --payload - reads standard input, which is closed;"
                             " give the JSON, or @FILE\n")
    with queue(db) as q:
        assert q.list_jobs() == []
