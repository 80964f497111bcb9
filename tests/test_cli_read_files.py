"""Every file fairsched reads (--config, --payload @FILE) is a regular file of bounded size: a
FIFO, a device or an oversized file is one line naming it, exit 2, at once, where a FIFO left
the command waiting for ever and /dev/zero as --config filled the memory."""

from __future__ import annotations

import os

import pytest

from fairsched.cli.queue_cmds import MAX_PAYLOAD_INPUT
from fairsched.config import MAX_CONFIG
from tests.test_cli_queue import WORKERS_TOML, fairsched, one_line_error

# Seconds a refusal may take at most: nothing waits for a writer, nothing is read whole.
# A command that blocks on a FIFO would run into it (TimeoutExpired fails the test).
QUICKLY = 30


def oversized_config(tmp_path):
    path = tmp_path / "big.toml"
    path.write_text(WORKERS_TOML + "# padding\n" + "#" * MAX_CONFIG + "\n")
    return path


def fifo(tmp_path):
    path = tmp_path / "pipe.toml"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("command", [["supervise"], ["ps"], ["jobs"], ["submit", "pdf"]])
@pytest.mark.parametrize("source, problem", [
    (lambda tmp_path: "/dev/zero", "is a character device, not a regular file"),
    (fifo, "is a FIFO, not a regular file"),
    (oversized_config, "is larger than 1 MiB, the most fairsched reads of it"),
], ids=["dev-zero", "fifo", "oversized"])
def test_a_config_that_is_no_regular_file_or_too_large_is_refused_in_one_line(
        db, tmp_path, command, source, problem):
    path = source(tmp_path)
    result = fairsched(*command, "--config", str(path), url=db, timeout=QUICKLY)
    assert one_line_error(result, 2) == f"fairsched: {path}: {problem}"


def test_a_config_just_under_the_cap_is_read(db, tmp_path):
    path = tmp_path / "workers.toml"
    path.write_text(WORKERS_TOML + "#" * (MAX_CONFIG - len(WORKERS_TOML) - 1) + "\n")
    assert path.stat().st_size == MAX_CONFIG
    result = fairsched("jobs", "--config", str(path), url=db, timeout=QUICKLY)
    assert result.returncode == 0, result.stderr


def oversized_payload(tmp_path):
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.truncate(MAX_PAYLOAD_INPUT + 1)  # sparse: no disk taken
    return path


@pytest.mark.parametrize("source, problem", [
    (lambda tmp_path: "/dev/zero",
     "--payload file '/dev/zero' is a character device, not a regular file: give a file, or - "
     "to read a pipe"),
    (fifo, "--payload file '{path}' is a FIFO, not a regular file: give a file, or - to read "
           "a pipe"),
    (oversized_payload, "--payload file '{path}' holds more than 64 MiB; a payload takes at "
                        "most 512 KiB of JSON"),
], ids=["dev-zero", "fifo", "oversized"])
def test_a_payload_file_that_is_no_regular_file_or_too_large_is_refused_in_one_line(
        db, tmp_path, source, problem):
    config = tmp_path / "workers.toml"
    config.write_text(WORKERS_TOML)
    path = source(tmp_path)
    result = fairsched("submit", "pdf", "--payload", f"@{path}", "--config", str(config),
                       url=db, timeout=QUICKLY)
    assert one_line_error(result, 2) == "fairsched: " + problem.format(path=path)
