"""The package holds what fairsched runs, each thing once: no function only the tests call,
no benchmark (scripts/ has them)."""

from __future__ import annotations

import ast
import collections
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "fairsched"
# For applications, not for fairsched itself: the handler API and the Queue.
PUBLIC_API = {PACKAGE / "__init__.py", PACKAGE / "job.py", PACKAGE / "store" / "queue.py"}
# Called by a library by their name: http.server's request handler, prometheus_client's
# collector protocol.
CALLED_BY_LIBRARIES = {("metrics.py", "log_message"), ("metrics.py", "handle_error"),
                       ("metrics.py", "describe"), ("metrics.py", "collect")}


def modules() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), str(path)))
            for path in sorted(PACKAGE.rglob("*.py"))]


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def names_used(tree: ast.Module) -> collections.Counter:
    """Every name the code reads: variables, attributes, imports, and the words of its strings
    (getattr, dispatch by name), its docstrings left out."""
    used = collections.Counter()
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            used[node.id] += 1
        elif isinstance(node, ast.Attribute):
            used[node.attr] += 1
        elif isinstance(node, ast.alias):
            used[node.name.rpartition(".")[2]] += 1
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings):
            used.update(re.findall(r"\w+", node.value))
    return used


def test_every_function_and_class_of_the_package_is_used_by_the_package():
    """What only the tests call is no part of fairsched: the tests go through what fairsched
    itself uses. (By name: a method sharing its name with one in use passes.)"""
    parsed = modules()
    used = collections.Counter()
    for _, tree in parsed:
        used.update(names_used(tree))
    compiled = "\n".join(p.read_text() for p in PACKAGE.rglob("*.pyx"))
    unused = []
    for path, tree in parsed:
        if path in PUBLIC_API:
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                    and not node.name.startswith("__") and not node.decorator_list
                    and (path.name, node.name) not in CALLED_BY_LIBRARIES
                    and not used[node.name]
                    and not re.search(rf"\b{node.name}\b", compiled)):
                unused.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert unused == []


def test_the_package_holds_no_benchmark_and_the_stores_runs_from_scripts(db):
    assert [p.name for p in PACKAGE.rglob("*.py") if p.name.startswith("bench")] == []
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_store.py"), "--url", db,
         "--jobs", "1000", "--deep", "1000"], capture_output=True, text=True, timeout=300)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    rows = result.stdout.splitlines()
    assert rows[0] == "database: external, 1000 jobs per measurement", rows
    assert [re.sub(r" +[\d,.]+ (jobs/s|ms per call).*", r" N \1", row) for row in rows[1:]] == [
        "enqueue_many, 1000 per batch: N jobs/s",
        "claim + complete, one job at a time: N jobs/s",
        "fetch 32, claim 32, complete 32: N jobs/s",
        "the same, 20 tenants (32 each): N jobs/s",
        "the same, type under [limits]: N jobs/s",
        "fetch with 2,000 pending jobs: N ms per call",
        "fetch with 2,000 pending jobs, 20 tenants: N ms per call",
    ], rows


def test_a_class_name_means_one_thing_across_the_package():
    homes = collections.defaultdict(list)
    for path, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                homes[node.name].append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in homes.items() if len(paths) > 1} == {}


def test_job_names_one_module_the_handlers_job():
    """fairsched.Job's module alone is named for jobs: the others say which of the job's
    faces they hold (rows of the table, work in flight, type names)."""
    named = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
             if {"job", "jobs"} & set(p.stem.split("_"))]
    assert named == ["job.py"]
    import fairsched

    assert fairsched.Job.__module__ == "fairsched.job"


def test_the_supervisors_classes_are_composed_not_mixed_in():
    """Each component of the actor owns its state (docs/architecture.md): a class in
    fairsched/supervisor/ has one base at most, besides object, Protocol and Enum."""
    allowed = {"object", "Protocol", "Enum", "StrEnum"}
    mixed = []
    for path, tree in modules():
        if path.parent.name != "supervisor":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b) for b in node.bases if ast.unparse(b) not in allowed]
                if len(bases) > 1:
                    mixed.append(f"{path.name}: {node.name}({', '.join(bases)})")
    assert not mixed, mixed
