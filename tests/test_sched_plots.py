"""Plots are an optional extra: drawn when matplotlib is there, one clear line when it is not."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from fairsched.sched import traces

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HINT = "fairsched: install matplotlib (pip install 'fairsched[plot]') to draw plots"
# Runs the command line with matplotlib unimportable, whether or not it is installed.
WITHOUT_MATPLOTLIB = ("import sys; sys.modules['matplotlib'] = None; "
                      "from fairsched.cli import main; main()")


def run(*args, code=None, cwd=None):
    cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "fairsched",
                                                            *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.fixture
def starvation_files(tmp_path):
    return traces.starvation(flood_seconds=200.0, rare_at=15.0).write(tmp_path)


def commands(tmp_path, starvation_files):
    trace_path, workers_path = starvation_files
    return [
        ["explain", "--plot", str(tmp_path / "scores.png")],
        ["simulate", str(trace_path), "--workers", str(workers_path), "--plot",
         str(tmp_path / "waits.png")],
    ]


def test_without_matplotlib_plots_fail_with_one_line(tmp_path, starvation_files):
    for args in commands(tmp_path, starvation_files):
        result = run(*args, code=WITHOUT_MATPLOTLIB, cwd=tmp_path)
        assert result.returncode == 1, result.stderr
        assert result.stderr.strip() == HINT
        assert not (tmp_path / "scores.png").exists() and not (tmp_path / "waits.png").exists()


def test_without_matplotlib_a_plot_is_refused_before_the_work_it_would_show(tmp_path):
    # The database (unreachable) is not asked, the trace (missing) not read: no matplotlib is
    # the news, before a replay of a long trace or a query that would come to nothing.
    workers = tmp_path / "workers.toml"
    workers.write_text('[supervisor]\ndatabase = "postgresql://nobody@127.0.0.1:1/none"\n\n'
                       '[[worker]]\nname = "pdf"\ntypes = ["pdf"]\nhandler = "m:f"\n')
    for args in (["explain", "--config", str(workers), "--job", "7", "--plot", "s.png"],
                 ["simulate", "missing.jsonl", "--workers", str(workers), "--plot", "w.png"]):
        result = run(*args, code=WITHOUT_MATPLOTLIB, cwd=tmp_path)
        assert (result.returncode, result.stderr.strip()) == (1, HINT), args


def test_plots_are_drawn_when_matplotlib_is_installed(tmp_path, starvation_files):
    installed = importlib.util.find_spec("matplotlib") is not None
    for args in commands(tmp_path, starvation_files):
        result = run(*args, cwd=tmp_path)
        out = tmp_path / args[args.index("--plot") + 1]
        if installed:
            assert result.returncode == 0, result.stderr
            assert out.read_bytes()[:8] == PNG_MAGIC
        else:
            assert result.returncode == 1 and result.stderr.strip() == HINT


def test_an_unwritable_plot_path_is_one_line(tmp_path):
    result = run("explain", "--plot", str(tmp_path / "missing" / "dir" / "x.png"),
                 code=None if importlib.util.find_spec("matplotlib") else WITHOUT_MATPLOTLIB,
                 cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0


def test_a_folder_given_as_the_plot_is_refused_not_written_beside(tmp_path):
    folder = tmp_path / "plots"
    folder.mkdir()
    result = run("explain", "--plot", str(folder),
                 code=None if importlib.util.find_spec("matplotlib") else WITHOUT_MATPLOTLIB,
                 cwd=tmp_path)
    assert result.returncode == 1
    if importlib.util.find_spec("matplotlib"):
        assert "is a folder" in result.stderr
    assert not (tmp_path / "plots.png").exists()


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_a_plot_named_without_a_suffix_is_written_under_that_name(tmp_path, starvation_files):
    trace_path, workers_path = starvation_files
    for args in (["explain", "--plot", "scores"],
                 ["simulate", str(trace_path), "--workers", str(workers_path), "--plot", "waits"]):
        result = run(*args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        name = args[-1]
        assert result.stdout.splitlines()[-1].endswith(f"drawn to {name}")
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC
        assert not (tmp_path / f"{name}.png").exists()


def test_an_empty_plot_name_is_bad_usage_not_a_silent_skip(tmp_path, starvation_files):
    # `--plot "$OUT"` with OUT unset: the command drew nothing and exited 0.
    trace_path, workers_path = starvation_files
    for args in (["explain", "--plot", ""],
                 ["simulate", str(trace_path), "--workers", str(workers_path), "--plot", ""]):
        result = run(*args, cwd=tmp_path)
        assert result.returncode == 2, (args, result.stdout)
        assert result.stderr.startswith("fairsched: Invalid value for --plot: must be a file "
                                         "name, got ''"), result.stderr
        assert result.stderr.count("\n") == 1
        assert result.stdout == ""


def test_a_plot_that_cannot_be_written_is_said_before_the_work_it_would_show(tmp_path):
    # A bad line at the end of a long trace, or one that replays for a minute, would be read
    # first, and the missing folder found only once everything else was done.
    workers = tmp_path / "workers.toml"
    workers.write_text('[[worker]]\nname = "pdf"\ntypes = ["pdf"]\nhandler = "m:f"\n')
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"at": 0, "type": "pdf", "duration": 1}\n{"at": -1}\n')
    installed = importlib.util.find_spec("matplotlib") is not None
    (tmp_path / "file").write_text("")
    for plot, problem in ((tmp_path / "missing" / "w.png", f"no folder {tmp_path / 'missing'}"),
                          (tmp_path / "file" / "w.png", f"{tmp_path / 'file'} is not a folder"),
                          (tmp_path, f"{tmp_path} is a folder")):
        result = run("simulate", str(trace), "--workers", str(workers), "--plot", str(plot),
                     code=None if installed else WITHOUT_MATPLOTLIB, cwd=tmp_path)
        assert result.returncode == 1, result.stderr
        assert result.stderr.strip() == (f"fairsched: cannot write plot {plot}: {problem}"
                                         if installed else HINT)


def test_a_plot_path_with_a_line_break_is_spelled_on_one_line(tmp_path, starvation_files):
    trace_path, workers_path = starvation_files
    missing = tmp_path / "no\nfolder"
    drawn = tmp_path / "my\nplot.png"
    for command in (["explain"], ["simulate", str(trace_path), "--workers", str(workers_path)]):
        result = run(*command, "--plot", str(missing / "p.png"), cwd=tmp_path)
        assert (result.returncode, result.stdout) == (1, ""), result.stderr
        assert result.stderr == (f"fairsched: cannot write plot {str(missing / 'p.png')!r}: "
                                 f"no folder {str(missing)!r}\n"), result.stderr
        result = run(*command, "--plot", str(drawn), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[-1].endswith(f" drawn to {str(drawn)!r}"), result.stdout
        assert drawn.read_bytes()[:8] == PNG_MAGIC
        drawn.unlink()
