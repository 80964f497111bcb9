"""From a checkout to a running fairsched. As a packager does it: `python -m build` makes an
sdist, then a wheel from that sdist, and the wheel installed into a fresh venv runs the
compiled core. As a first-time user does it: `make run` in a fresh clone says each step in
one line, and stops at once, saying why, on a Python too old or without a C compiler.

One build serves the packaging tests (about 20 s: compiling the core is most of it); the
first `make run` takes about 40 s more with pip's cache warm.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest

from tests.supervisor_harness import wait_until

ROOT = Path(__file__).resolve().parent.parent
CORE = ["_pool_c", "_scoring_c", "_matching_c", "_cache_c", "_idmap_c"]
# What a checkout holds besides its sources: a packager's clean clone has none of it.
_NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.so", "*.c", "*.html",
    ".fairsched", ".pytest_cache", ".hypothesis", "samples", "traces")


def NOT_SOURCES(folder: str, names: list[str]) -> set[str]:
    """What Cython and the builds make; the web dashboard's page is a source."""
    ignored = _NOT_SOURCES(folder, names)
    if Path(folder) == ROOT / "fairsched" / "web" / "static":
        ignored.discard("index.html")
    return ignored


def _env(**extra):
    # Neither the twin nor the make (`make test ARGS=...`) that may be running these tests.
    env = {k: v for k, v in os.environ.items()
           if k not in ("FAIRSCHED_NO_EXTENSIONS", "PYTHONPATH", "MAKEFLAGS", "MFLAGS",
                        "MAKELEVEL")}
    env.update(extra)
    return env


def _checkout(dest: Path) -> Path:
    shutil.copytree(ROOT, dest, ignore=NOT_SOURCES)
    return dest


# The web dashboard's page and what it loads, served from the package: no build step.
DASHBOARD_PAGE = "fairsched/web/static/index.html"
DASHBOARD_FILES = {DASHBOARD_PAGE, "fairsched/web/static/app.js", "fairsched/web/static/style.css",
                   "fairsched/web/static/vendor/uPlot.iife.min.js",
                   "fairsched/web/static/vendor/uPlot.min.css",
                   "fairsched/web/static/vendor/LICENSE"}


def _build(args, cwd, **env):
    return subprocess.run([sys.executable, "-m", "build", *args], cwd=cwd, env=_env(**env),
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(sdist, wheel) from `python -m build` on a copy of the checkout. Built once per run:
    under pytest-xdist by the first worker to ask, in the folder the workers' temp folders
    share, while the others wait for it rather than build again."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    base = root / "packaging"
    dist = base / "dist"
    with open(root / "packaging.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes
        if not (base / "built").exists():
            shutil.rmtree(base, ignore_errors=True)  # what a build that failed left
            src = _checkout(base / "src")
            # Isolated, as by default: the build gets only what [build-system] requires.
            result = _build(["--outdir", str(dist), str(src)], cwd=base)
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
            (base / "built").touch()
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    return sdist, wheel


def test_the_sdist_holds_the_cython_sources_and_nothing_generated(built):
    sdist, _ = built
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    for module in CORE:
        assert f"fairsched/core/{module}.pyx" in names
        assert f"fairsched/core/{module}.pxd" in names
    assert "fairsched/worker/_orphan_c.pyx" in names
    generated = sorted(n for n in names if n.endswith((".c", ".html", ".so", ".pyc"))
                       and n != DASHBOARD_PAGE)
    assert generated == []
    assert DASHBOARD_FILES <= names


def test_the_wheel_from_the_sdist_carries_the_compiled_core(built):
    _, wheel = built
    tag = wheel.name.removesuffix(".whl").split("-")[2:]
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert tag[:2] == [py, py], wheel.name  # not py3-none-any
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
    for module in [f"core/{name}" for name in CORE] + ["worker/_orphan_c"]:
        assert [n for n in names if n.startswith(f"fairsched/{module}.")
                and n.endswith(".so")], f"{module} is not compiled in {wheel.name}: {names}"
    assert sorted(n for n in names if n.endswith((".c", ".html")) and n != DASHBOARD_PAGE) == []
    assert DASHBOARD_FILES <= set(names)


def test_the_wheel_installed_in_a_fresh_venv_runs_the_compiled_core(built, tmp_path):
    _, wheel = built
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    # fairsched.core imports nothing outside the standard library: no dependency is needed.
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--no-index", str(wheel)], env=_env(), capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr
    code = ("import fairsched.core as c, fairsched.core._pool_c as p\n"
            "print(c.__impl__, c.compiled_error(), p.__file__)")
    # From the venv's folder, so this checkout's fairsched is not the one imported.
    run = subprocess.run([str(python), "-c", code], cwd=tmp_path, env=_env(),
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    impl, error, so = run.stdout.split()
    assert (impl, error) == ("c", "None")
    assert Path(so).is_relative_to(venv), so


def test_a_missing_pyx_stops_the_build_unless_the_twin_is_asked_for(built, tmp_path):
    sdist, _ = built
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path, filter="data")
    (src,) = tmp_path.glob("fairsched-*")
    (src / "fairsched" / "core" / "_scoring_c.pyx").unlink()
    dist = tmp_path / "dist"
    # Without isolation: the check comes before anything is compiled or installed.
    failed = _build(["--wheel", "--no-isolation", "--outdir", str(dist), str(src)],
                    cwd=tmp_path)
    assert failed.returncode != 0
    assert ("error: the compiled core's source fairsched/core/_scoring_c.pyx is missing; "
            "set FAIRSCHED_NO_EXTENSIONS=1 to build fairsched with its pure-Python core only"
            ) in failed.stderr.splitlines(), failed.stderr
    assert not dist.exists() or list(dist.glob("*.whl")) == []

    twin = _build(["--wheel", "--no-isolation", "--outdir", str(dist), str(src)],
                  cwd=tmp_path, FAIRSCHED_NO_EXTENSIONS="1")
    assert twin.returncode == 0, twin.stderr
    assert [w.name for w in dist.glob("*.whl")] == ["fairsched-0.1.0-py3-none-any.whl"]


# What pip, setuptools, Cython and the compiler say when they are not told to be quiet.
CHATTER = re.compile(r"Collecting|Downloading|Installing|Successfully|Requirement already|"
                     r"Obtaining|Building|Compiling|Cythonizing|gcc |BuildBackendWarning|"
                     r"Editable install|running build|copying ")


def test_a_first_make_run_says_each_step_in_one_line_then_supervises(db, short_tmp):
    # A short folder: the control socket's path lies inside the checkout, and must stay
    # under the ~107 bytes of AF_UNIX however deep pytest's own temp folders are (its
    # xdist workers add a level).
    src = _checkout(short_tmp / "src")
    # The test database rather than an embedded one: the steps are what is under test.
    env = _env(FAIRSCHED_DATABASE_URL=db)
    out, err = [], []
    make = subprocess.Popen(["make", "run"], cwd=src, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    readers = [threading.Thread(target=lambda f=f, into=into: into.extend(f), daemon=True)
               for f, into in ((make.stdout, out), (make.stderr, err))]
    for reader in readers:
        reader.start()
    fairsched = [str(src / ".venv" / "bin" / "fairsched")]
    config = ["--config", str(src / "examples" / "workers.toml")]

    def all_free():
        if make.poll() is not None:
            raise AssertionError(f"make run exited {make.returncode}:\n{''.join(out + err)}")
        if not os.path.exists(fairsched[0]):
            return False
        ps = subprocess.run([*fairsched, "ps", "--json", *config], env=env,
                            capture_output=True, text=True, timeout=60)
        return ps.returncode == 0 and all(s["state"] == "free"
                                          for s in json.loads(ps.stdout)["slots"])

    try:
        wait_until(all_free, timeout=900, interval=0.5,
                   what=lambda: "make run to start the supervisor:\n" + "".join(out + err))
        stop = subprocess.run([*fairsched, "stop", *config], env=env, capture_output=True,
                              text=True, timeout=60)
        assert stop.returncode == 0, stop.stderr
        assert make.wait(timeout=60) == 0
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait()
        for reader in readers:
            reader.join(timeout=10)
        make.stdout.close()
        make.stderr.close()
    # The python3 that make finds, as a user's make would.
    python = subprocess.run(["python3", "-c", "import platform; print(platform.python_version())"],
                            env=env, capture_output=True, text=True, timeout=60).stdout.strip()
    assert [line.rstrip("\n") for line in out] == [
        f"==> creating .venv with python3 ({python}) and the build tools",
        "==> installing fairsched and its dependencies into .venv (pip; a minute or two the "
        "first time)",
        "==> compiling the scheduling core (Cython, then the C compiler)",
        "==> starting the supervisor on examples/workers.toml (Ctrl-C or fairsched stop ends it)",
    ]
    assert [line for line in err if CHATTER.search(line)] == []
    # Done once: the next make says nothing.
    again = subprocess.run(["make", "build"], cwd=src, env=env, capture_output=True, text=True,
                           timeout=120)
    assert (again.returncode, again.stdout, again.stderr) == (0, "", "")


def _older_python():
    """An interpreter older than 3.11 on this machine, or None."""
    found = [shutil.which(f"python3.{minor}") for minor in range(10, 5, -1)]
    found += sorted(Path.home().glob(".pyenv/versions/3.1[0-9].*/bin/python3"))
    found += sorted(Path.home().glob(".pyenv/versions/3.[6-9].*/bin/python3"))
    for python in filter(None, found):
        version = subprocess.run([str(python), "-c", "import sys; print(sys.version_info[1])"],
                                 capture_output=True, text=True, timeout=60)
        if version.returncode == 0 and int(version.stdout) < 11:
            return str(python)
    return None


def _make_run_fails(tmp_path, *args, **env):
    src = _checkout(tmp_path / "src")
    result = subprocess.run(["make", "run", *args], cwd=src, env=_env(**env),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""  # not a step begun
    assert not (src / ".venv").exists()
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and lines[1].startswith("make: *** "), result.stderr
    return lines[0]


def test_make_run_on_a_python_too_old_stops_before_anything_with_one_line(tmp_path):
    python = _older_python()
    if python is None:
        pytest.skip("no Python older than 3.11 on this machine")
    version = subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, timeout=60).stdout.strip()
    line = _make_run_fails(tmp_path, f"PYTHON={python}")
    assert re.fullmatch(
        rf"fairsched: Python {re.escape(version)} \(.+\) is too old: fairsched needs Python 3\.11 "
        r"or later \(make run PYTHON=python3\.11 picks another interpreter\)", line), line


def test_make_run_without_a_c_compiler_stops_before_anything_with_one_line(tmp_path):
    line = _make_run_fails(tmp_path, CC="no-such-cc")
    assert line == ("fairsched: no C compiler: 'no-such-cc' ($CC) is not on PATH; install one "
                    "(Debian and Ubuntu: gcc) or set CC")
