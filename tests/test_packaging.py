"""Packaging as a packager does it: `python -m build` makes an sdist, then a wheel from that
sdist, and the wheel installed into a fresh venv runs the compiled core.

One build serves every test here (about 20 s: compiling the core is most of it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ["_pool_c", "_scoring_c", "_matching_c"]
# What a checkout holds besides its sources: a packager's clean clone has none of it.
NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.so", "*.c", "*.html",
    ".fairsched", ".pytest_cache", ".hypothesis", "samples", "traces")


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("FAIRSCHED_NO_EXTENSIONS", "PYTHONPATH")}
    env.update(extra)
    return env


def _build(args, cwd, **env):
    return subprocess.run([sys.executable, "-m", "build", *args], cwd=cwd, env=_env(**env),
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(sdist, wheel) from `python -m build` on a copy of the checkout."""
    base = tmp_path_factory.mktemp("packaging")
    src = base / "src"
    shutil.copytree(ROOT, src, ignore=NOT_SOURCES)
    dist = base / "dist"
    # Isolated, as by default: the build gets only what [build-system] requires.
    result = _build(["--outdir", str(dist), str(src)], cwd=base)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
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
    generated = sorted(n for n in names if n.endswith((".c", ".html", ".so", ".pyc")))
    assert generated == []


def test_the_wheel_from_the_sdist_carries_the_compiled_core(built):
    _, wheel = built
    tag = wheel.name.removesuffix(".whl").split("-")[2:]
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert tag[:2] == [py, py], wheel.name  # not py3-none-any
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
    for module in CORE:
        assert [n for n in names if n.startswith(f"fairsched/core/{module}.")
                and n.endswith(".so")], f"{module} is not compiled in {wheel.name}: {names}"
    assert sorted(n for n in names if n.endswith((".c", ".html"))) == []


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
