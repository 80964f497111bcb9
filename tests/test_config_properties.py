"""workers.toml mutated at random: every document loads, or is refused with one line naming
the file; `supervise` on it exits 2 with that one line, never a traceback."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fairsched.config import Config, load_config
from fairsched.errors import ConfigError
from fairsched.supervisor.process import WorkerProcess

BASE = {
    "supervisor": {"state_dir": "state", "shutdown_timeout": 3, "lease": 15},
    "scoring": {"age_weight": 16, "priority_weight": 1024},
    "worker": [
        {"name": "pdf", "types": ["pdf"], "handler": "handlers:render_pdf", "processes": 2},
        {"name": "tool", "types": ["pdf", "excel"], "command": ["./bin/tool"], "slots": 3,
         "timeout": 5, "env": {"A": "b"}},
    ],
}
KEYS = {
    "supervisor": ["state_dir", "shutdown_timeout", "database", "lease", "heartbeat_interval",
                   "poll_interval", "metrics"],
    "scoring": ["priority_weight", "age_weight", "rarity_weight", "on_demand_bonus",
                "on_demand_age_weight", "matching"],
    "worker": ["name", "types", "handler", "command", "processes", "slots", "max_attempts",
               "timeout", "start_timeout", "retry_backoff", "max_restarts", "restart_window",
               "env", "cwd"],
}
NAMES = ["pdf", "pdf-1", "pdf-2", "pdf 1", "a/b", "../x", "é", "名前", "", " ", ".", "_", "x" * 300,
         "pdf.1", "tool"]
TEXT = st.one_of(st.sampled_from(NAMES + ["handlers:", ":f", "a:b:c", "mod:1f", "1mod:f",
                                          "mod.:f", "/no/such/program", "127.0.0.1:99999"]),
                 st.text(max_size=12))
NUMBER = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 2**63, 2**63 - 1, -(2**63), 10**400, -(10**400), 1001, 2**31]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
)
SCALAR = st.one_of(TEXT, NUMBER)
GARBAGE = st.recursive(
    SCALAR,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=6,
)


def toml_key(key: str) -> str:
    return toml_string(key)


def toml_string(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\' or ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_document(doc: dict) -> str:
    return "".join(f"{toml_key(k)} = {toml_value(v)}\n" for k, v in doc.items())


@st.composite
def documents(draw) -> dict:
    """BASE with a few mutations: a key's value replaced by garbage, a key dropped or added,
    a whole table replaced, a worker group added whose name may collide."""
    doc = json.loads(json.dumps(BASE))
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["set", "set", "set", "drop", "add", "table", "group"]))
        section = draw(st.sampled_from(["supervisor", "scoring", "worker"]))
        if action == "table":
            doc[section] = draw(GARBAGE)
            continue
        if action == "group":
            if isinstance(doc.get("worker"), list):
                doc["worker"].append({"name": draw(st.sampled_from(NAMES)), "types": ["x"],
                                      "command": [draw(TEXT)],
                                      "processes": draw(st.integers(1, 3))})
            continue
        tables = doc.get(section)
        if section == "worker":
            tables = tables if isinstance(tables, list) else []
            tables = [t for t in tables if isinstance(t, dict)]
            if not tables:
                continue
            table = draw(st.sampled_from(tables))
        elif isinstance(tables, dict):
            table = tables
        else:
            continue
        if action == "set":
            key = draw(st.sampled_from(KEYS[section]))
            table[key] = draw(st.one_of(GARBAGE, st.sampled_from(NAMES)))
        elif action == "drop" and table:
            del table[draw(st.sampled_from(sorted(table)))]
        elif action == "add":
            table[draw(TEXT)] = draw(GARBAGE)
    return doc


def check_loaded(config: Config) -> None:
    """What a config that loads promises the supervisor."""
    groups = [w.name for w in config.workers]
    processes = [WorkerProcess(w, i).name for w in config.workers  # as the supervisor names them
                 for i in range(1, w.processes + 1)]
    assert len(set(groups)) == len(groups)
    assert len(set(processes)) == len(processes)
    assert not set(groups) & set(processes), (groups, processes)
    for w in config.workers:
        assert "/" not in w.name and w.name.strip() == w.name and w.types
        for value in (w.timeout, w.start_timeout, w.retry_backoff, w.restart_window):
            assert value is None or (math.isfinite(value) and value >= 0)


def load_or_one_line(path: Path) -> Config | None:
    try:
        config = load_config(path)
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith(str(path) + ": "), message
        assert "\n" not in message and "\r" not in message, message
        return None
    check_loaded(config)
    return config


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(documents())
def test_a_mutated_config_loads_or_is_refused_in_one_line(doc):
    with tempfile.TemporaryDirectory(prefix="fs-") as folder:
        path = Path(folder) / "workers.toml"
        path.write_text(toml_document(doc), encoding="utf-8")
        load_or_one_line(path)


@settings(max_examples=6, suppress_health_check=[HealthCheck.too_slow])
@given(documents())
def test_supervise_on_a_mutated_config_exits_2_with_one_line(doc):
    # No database can be reached at a URL that is not one: a config that loads exits 2 too,
    # saying so, before any worker starts.
    with tempfile.TemporaryDirectory(prefix="fs-") as folder:
        path = Path(folder) / "workers.toml"
        path.write_text(toml_document(doc), encoding="utf-8")
        loaded = load_or_one_line(path)
        # supervise makes state_dir first: only inside the test's own folder.
        assume(loaded is None or loaded.supervisor.state_dir.resolve().is_relative_to(folder))
        proc = subprocess.run(
            [sys.executable, "-m", "fairsched", "supervise", "--config", str(path)],
            capture_output=True, text=True, timeout=60,
            env=dict(os.environ, FAIRSCHED_DATABASE_URL="garbage://"))
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        if loaded is None:
            assert lines[0].startswith(f"fairsched: {path}: "), lines
        else:
            assert "FAIRSCHED_DATABASE_URL is not a PostgreSQL URL" in lines[0], lines
