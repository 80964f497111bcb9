"""The docs (README.md, docs/operations.md, docs/fairsched.service) stay true to the code they
describe."""

import ast
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import click
import pytest

import fairsched.config
import fairsched.supervisor.actor
import fairsched.supervisor.metrics
import fairsched.supervisor.running
import fairsched.supervisor.status
from fairsched.cli import main
from fairsched.cli.supervisor_cmds import PS_COLUMNS, supervise
from fairsched.supervisor.metrics import PrometheusObserver, Snapshot
from fairsched.supervisor.states import SLOT_STATE, ProcessState

DOCS = Path(__file__).resolve().parent.parent / "docs"
OPERATIONS = DOCS / "operations.md"
UNIT = DOCS / "fairsched.service"
SYSTEM_UNITS = Path("/usr/lib/systemd/system")


def operations() -> str:
    return OPERATIONS.read_text()


def code_spans(text: str) -> set[str]:
    return set(re.findall(r"`([^`\n]+)`", text))


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """systemd's unit syntax: sections, Key=value lines (keys may repeat), # and ; comments."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        header = re.fullmatch(r"\[([A-Za-z]+)\]", line)
        if header:
            current = sections.setdefault(header.group(1), {})
            continue
        match = re.fullmatch(r"([A-Za-z][A-Za-z0-9]*)=(.*)", line)
        assert match and current is not None, f"{UNIT.name}:{number}: not a unit line: {raw!r}"
        current.setdefault(match.group(1), []).append(match.group(2))
    return sections


def test_every_metric_is_documented_and_every_documented_metric_exists():
    source = Path(fairsched.supervisor.metrics.__file__).read_text()
    exported = set(re.findall(r'"(fairsched_[a-z_]+)"', source))
    counters = set(re.findall(r'Counter\("(fairsched_[a-z_]+)"', source))
    names = {f"{n}_total" if n in counters else n for n in exported}
    assert len(names) >= 12
    text = operations()
    missing = sorted(n for n in names if f"`{n}`" not in text)
    assert not missing, f"metrics missing from docs/operations.md: {missing}"
    mentioned = set(re.findall(r"\b(fairsched_[a-z_]+)", text))
    tables = {"fairsched_jobs", "fairsched_supervisors", "fairsched_schedules",
              "fairsched_schema_version", "fairsched_tenant_usage", "fairsched_limit_holds",
              "fairsched_notify_jobs"}  # and the function of its trigger
    suffixes = ("_bucket", "_count", "_sum")

    def known(m: str) -> bool:
        if m.endswith("_"):  # a family written as fairsched_queue_*
            return any(n.startswith(m) for n in names)
        return m in names or (m.endswith(suffixes) and m.rsplit("_", 1)[0] in names)

    unknown = sorted(m for m in mentioned - tables if not known(m))
    assert not unknown, f"docs/operations.md mentions metrics that do not exist: {unknown}"


def test_ps_columns_and_states_are_documented():
    text = operations()
    spans = code_spans(text)
    assert not [c for c in PS_COLUMNS if c not in spans], "a ps column is not documented"
    states = {"free", "busy", *SLOT_STATE.values()}
    assert states == {"free", "busy", "starting", "stopping", "down", "fatal"}
    assert not [s for s in states if f"| `{s}` |" not in text], "a slot state is not documented"
    process_states = {s.value for s in ProcessState}
    assert not [s for s in process_states if f"`{s}`" not in text]


def commands_in(text: str) -> set[str]:
    """The subcommand after each `fairsched` program name in code spans and blocks."""
    code = re.findall(r"```.*?```", text, flags=re.S) + list(code_spans(text))
    used = set()
    for snippet in code:
        for line in snippet.splitlines():
            tokens = line.replace("`", " ").split()
            for i, token in enumerate(tokens[:-1]):
                program = token == "fairsched" or token.endswith("/bin/fairsched")
                as_user = i > 0 and (tokens[i - 1] in ("-u", "--user")
                                     or tokens[i - 1].startswith("/"))
                word = re.match(r"[a-z]+", tokens[i + 1])
                if program and not as_user and word:
                    used.add(word.group())
    return used


def test_commands_in_the_docs_exist():
    service = parse_unit(UNIT.read_text())["Service"]
    exec_lines = "\n".join(v for k, vs in service.items() if k.startswith("Exec") for v in vs)
    used = commands_in(operations()) | commands_in(f"```\n{exec_lines}\n```")
    assert {"supervise", "ps", "restart", "jobs", "retry", "cancel", "explain"} <= used
    unknown = sorted(c for c in used if c not in main.commands)
    assert not unknown, f"the docs use commands that do not exist: {unknown}"


def test_unit_file_has_what_the_supervisor_needs():
    unit = parse_unit(UNIT.read_text())
    assert set(unit) == {"Unit", "Service", "Install"}
    service = unit["Service"]
    for key in ("ExecStart", "User", "KillMode", "TimeoutStopSec", "Restart",
                "RestartPreventExitStatus"):
        assert key in service, f"[Service] has no {key}="
    assert unit["Unit"]["Description"] and unit["Install"]["WantedBy"] == ["multi-user.target"]
    # SIGTERM to the supervisor alone, so it can hand jobs back before its workers stop.
    assert service["KillMode"] == ["mixed"]
    assert service["RestartPreventExitStatus"] == ["2"]
    # The default shutdown_timeout, then the default lease to record outcomes, and a margin.
    assert int(service["TimeoutStopSec"][0]) >= 10 + 15 + 10
    argv = shlex.split(service["ExecStart"][0])
    assert Path(argv[0]).name == "fairsched" and argv[1] == "supervise"
    # The options parse as the real command's options (click raises on an unknown one).
    context = supervise.make_context("supervise", argv[2:])
    assert context.params["log_format"] == "json"
    assert context.params["config_path"] == "/etc/fairsched/workers.toml"


def systemd_verify(tmp_path: Path, name: str, text: str) -> subprocess.CompletedProcess | None:
    """systemd-analyze verify in a scratch root holding the system's units and a stub for
    each program the unit runs; None where systemd-analyze is not installed."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None or not SYSTEM_UNITS.is_dir():
        return None
    root = tmp_path / "root"
    shutil.copytree(SYSTEM_UNITS, root / SYSTEM_UNITS.relative_to("/"), symlinks=True)
    service = parse_unit(text).get("Service", {})
    for key, values in service.items():
        if key.startswith("Exec"):
            for value in values:
                stub = root / shlex.split(value)[0].lstrip("/")
                stub.parent.mkdir(parents=True, exist_ok=True)
                stub.write_text("#!/bin/sh\n")
                stub.chmod(0o755)
    target = root / "etc/systemd/system" / name
    target.parent.mkdir(parents=True)
    target.write_text(text)
    return subprocess.run([analyze, "verify", f"--root={root}", str(target)],
                          capture_output=True, text=True, timeout=60)


def test_unit_file_passes_systemd_verify(tmp_path):
    text = UNIT.read_text()
    result = systemd_verify(tmp_path, "fairsched.service", text)
    if result is None:  # no systemd here: the hand parse above is the check, done again
        assert parse_unit(text)["Service"]["ExecStart"]
        return
    # verify exits 0 on a value it ignores: any message at all is a failure.
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr)


@pytest.mark.parametrize("broken", ["KillMode=mixd", "RestartSec=five", "Restart=sometimes"])
def test_the_unit_check_catches_a_bad_value(tmp_path, broken):
    text = UNIT.read_text().replace("[Service]\n", f"[Service]\n{broken}\n")
    result = systemd_verify(tmp_path, "fairsched.service", text)
    if result is None:
        with pytest.raises(AssertionError):
            parse_unit(text.replace(broken, broken.replace("=", " ")))
        return
    assert broken.split("=")[1] in result.stdout + result.stderr


def section(text: str, heading: str) -> str:
    """The text under a `## heading` (or `###`), up to the next heading of its level."""
    level = re.match(r"#+", heading).group()
    start = text.index(f"\n{heading}\n")
    end = text.find(f"\n{level} ", start + len(heading) + 2)
    return text[start:end if end != -1 else len(text)]


def table_after(text: str, header: str) -> list[list[str]]:
    """The cells of each body row of the Markdown table whose header row starts `header`."""
    lines = text[text.index(f"\n{header}"):].splitlines()[1:]
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split(" | ")])
    return rows


def call_keywords(path: Path, names: set[str]) -> dict[str, set]:
    """Keyword names of every call to one of `names` in a module, and the constant values
    given to them."""
    found: dict[str, set] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in names):
            for kw in (k for k in node.keywords if k.arg is not None):  # not **more
                values = found.setdefault(kw.arg, set())
                if isinstance(kw.value, ast.Constant):
                    values.add(kw.value.value)
    return found


def test_settings_tables_and_the_code_name_the_same_keys():
    source = Path(fairsched.config.__file__).read_text()
    text = section(operations(), "## Settings")
    for table, reader in (("[supervisor]", "sup"), ("[scoring]", "sc"), ("[[worker]]", "sec"),
                          ("[[schedule]]", "sched")):
        accepted = set(re.findall(rf'\b{reader}\.get\("(\w+)"', source))
        rows = table_after(text, f"| `{table}` |")
        documented = {k for row in rows for k in re.findall(r"`(\w+)`", row[0])}
        assert documented == accepted, (
            f"{table}: documented only {sorted(documented - accepted)}, "
            f"accepted only {sorted(accepted - documented)}")


def test_every_structured_log_key_and_event_is_documented():
    package = Path(fairsched.config.__file__).parent
    keys: set[str] = set()
    events: set[str] = set()
    for module in package.rglob("*.py"):
        found = call_keywords(module, {"fields", "job_fields"})
        keys |= set(found)
        events |= found.get("event", set())
    assert {"job_id", "worker", "outcome", "restart_in"} <= keys
    assert {"job_started", "job_finished", "worker_exited"} <= events
    text = section(operations(), "## Logs")
    missing = sorted(k for k in keys | events if f"`{k}`" not in text)
    assert not missing, f"JSON log keys missing from docs/operations.md, Logs: {missing}"


def test_every_ps_json_field_is_documented():
    status = Path(fairsched.supervisor.status.__file__)
    fields = set()
    for node in ast.walk(ast.parse(status.read_text())):
        if isinstance(node, ast.Dict):
            fields |= {k.value for k in node.keys if isinstance(k, ast.Constant)}
        elif (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store)
                and isinstance(node.slice, ast.Constant)):  # row["slot"] = ..., not groups[name]
            fields.add(node.slice.value)
    fields |= {"rss", "cpu", "suspended"}  # added by the ps command itself, with psutil
    # The counters: the jobs' (self.counters = {...}) and those the actor adds to them in
    # Supervisor.counters().
    for module in (fairsched.supervisor.running, fairsched.supervisor.actor):
        for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                    and any(isinstance(x, ast.Attribute) and x.attr == "counters"
                            for x in node.targets)):
                fields |= {k.value for k in node.value.keys}
            elif (isinstance(node, ast.FunctionDef) and node.name == "counters"):
                for ret in ast.walk(node):
                    if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Dict):
                        fields |= {k.value for k in ret.value.keys if k is not None}
    assert {"worker", "job_id", "process_state", "counters", "claim_losses"} <= fields
    text = section(operations(), "## Reading `fairsched ps`")
    missing = sorted(f for f in fields if f"`{f}`" not in text and f"\"{f}\"" not in text)
    assert not missing, f"ps --json fields missing from docs/operations.md: {missing}"


def test_the_metrics_table_gives_each_metric_its_type_and_labels():
    observer = PrometheusObserver("127.0.0.1:0")  # not started: nothing listens
    observer.snapshot = Snapshot(types=("pdf",), in_flight={"pdf": 1},
                                 slots={("pdf", "free"): 1, ("pdf", "busy"): 1},
                                 workers={("pdf", "running"): 1}, limits={"pdf": 2})
    observer.depth.read = lambda: ([("pdf", "pending", 3, 2.5)], 1)
    observer.job_started("pdf", 0.1)
    observer.job_finished("pdf", "succeeded", 0.2)
    observer.job_unrecorded("pdf", "succeeded")
    observer.worker_restarted("pdf")
    observer.worker_recycled("pdf", "max_jobs")
    observer.claims_lost(1)
    observer.jobs_pruned(2)
    observer.group_scaled("pdf", 2, "up")
    exported = {}
    for family in observer.registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {k for s in family.samples for k in s.labels} - {"le"}
        exported[name] = (family.type, labels)
    rows = table_after(section(operations(), "## Metrics"), "| metric |")
    documented = {row[0].strip("`"): (row[1], set(re.findall(r"`(\w+)`", row[2])))
                  for row in rows}
    wrong = {n: (documented.get(n), exported.get(n)) for n in documented.keys() | exported.keys()
             if documented.get(n) != exported.get(n)}
    assert not wrong, f"metrics table (type, labels) against the code's: {wrong}"


def test_every_command_option_is_in_the_readme_commands_table():
    readme = (DOCS.parent / "README.md").read_text()
    rows = [row[0] for row in table_after(section(readme, "## Commands"), "| command |")]
    headings = re.findall(r"^## `(fairsched [^`]+)`", (DOCS / "scheduling.md").read_text(), re.M)
    missing = []
    for name, command in main.commands.items():
        text = " ".join(r for r in rows + headings if re.search(rf"`fairsched {name}\b", r))
        assert text, f"fairsched {name} has no row in README's Commands table"
        for param in command.params:
            # --config and --socket: the paragraph below the table, checked next.
            if isinstance(param, click.Option) and param.name not in ("config_path", "socket_path"):
                if not any(re.search(rf"{o}\b", text) for o in param.opts):
                    missing.append(f"{name} {'/'.join(param.opts)}")
    assert not missing, f"options missing from README's Commands table: {missing}"
    with_socket = sorted(n for n, c in main.commands.items()
                         if any(p.name == "socket_path" for p in c.params))
    assert with_socket == ["ps", "reload", "restart", "stop", "submit"]
    assert all(any(p.name == "config_path" for p in c.params) for c in main.commands.values())
    assert "`--socket PATH`" in readme and "Every command takes `--config workers.toml`" in readme
    assert "`fairsched --version`" in readme and "`fairsched --debug" in readme


def test_readme_map_names_existing_files_and_every_supervisor_module():
    root = DOCS.parent
    rows = table_after(section((root / "README.md").read_text(), "## Development"), "| path |")
    named = set()
    for row in rows:
        paths = re.findall(r"`([\w/.]+)`", row[0])
        folder = Path(paths[0]).parent if paths[0].endswith(".py") else Path(paths[0])
        for p in paths:
            path = root / p if "/" in p else root / folder / p
            assert path.exists(), f"README's map names {p}, which does not exist"
            named.add(path.resolve())
    supervisor = root / "fairsched" / "supervisor"
    unnamed = sorted(f.name for f in supervisor.glob("*.py")
                     if f.name != "__init__.py" and f.resolve() not in named)
    assert not unnamed, f"supervisor modules missing from README's map: {unnamed}"


PLACEHOLDER = r"%[-+ #0]*\d*(?:\.\d+)?[sdgfr]"
# Values in the docs' example lines (types, worker and job ids, the core, the database);
# the code has a placeholder there.
EXAMPLE_VALUES = {"pdf", "excel", "office", "index", "od", "c", "external", "postgresql",
                  "RuntimeError"}


def message_text(package: Path) -> str:
    """Every string literal of the package, split at its %-placeholders and f-string fields
    (a plural's 's' kept: 'job%s' reads 'jobs')."""
    pieces = []
    for module in package.rglob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                pieces += re.split(PLACEHOLDER, re.sub(r"(?<=[a-z])%s", "s", node.value))
            elif isinstance(node, ast.JoinedStr):
                pieces.append("".join(
                    v.value if isinstance(v, ast.Constant)
                    else "s" if "'s'" in ast.unparse(v.value) else "\n" for v in node.values))
    return "\n".join(pieces)


def wording_not_in(line: str, text: str) -> list[str]:
    """The stretches of wording of a documented log line (between its values and its '...')
    that no string of the code holds, whole or clause by clause."""
    phrases, current = [], []
    for token in re.findall(r"[A-Za-z_']+|\d+(?:\.\d+)?|\.\.\.|\W", line) + ["..."]:
        if token == "..." or token in EXAMPLE_VALUES or token[0].isdigit():
            phrases.append("".join(current).strip(" -/.:"))
            current = []
        else:
            current.append(token)
    missing = []
    for phrase in phrases:
        if re.search("[A-Za-z]", phrase) and phrase not in text:
            clauses = (c.strip(" -/.") for c in re.split(r"[;:,()]", phrase))
            missing += [c for c in clauses if re.search("[A-Za-z]", c) and c not in text]
    return missing


def test_every_line_in_the_log_table_is_worded_as_the_code_logs_it():
    text = message_text(Path(fairsched.config.__file__).parent)
    rows = table_after(section(operations(), "## Logs"), "| line | level |")
    lines = [a or b for row in rows for a, b in re.findall(r"``(.+?)``|`([^`]+)`", row[0])]
    assert len(lines) >= 30 and "database connection restored" in lines
    assert wording_not_in("worker pdf-1 exited with code 1; restart in 0.4 s", text) == [
        "restart in"]
    wrong = {line: missing for line in lines if (missing := wording_not_in(line, text))}
    assert not wrong, f"log lines in docs/operations.md, Logs, that the code never writes: {wrong}"


def test_the_attempts_of_a_job_whose_max_attempts_is_unknown_are_explained():
    # `fairsched jobs` shows '0/-' on a host without workers.toml: say what the '-' is.
    text = " ".join(section(operations(), "## Failed jobs: the dead-letter list").split())
    assert "`ATTEMPTS` is the attempts made over the job's `max_attempts`" in text
    assert "and `-` (`0/-`) where none does" in text
    assert "`null` until the job is claimed" in text
