"""workers.toml: good files load, every kind of mistake exits 2 with one line naming it."""

import os
import subprocess
import sys
import textwrap

import pytest

from fairsched.config import load_config
from fairsched.errors import ConfigError

GOOD = """
[supervisor]
state_dir = "state"
shutdown_timeout = 3

[scoring]
age_weight = 32

[[worker]]
name = "pdf"
types = ["pdf"]
handler = "handlers:render_pdf"
processes = 2

[[worker]]
name = "tool"
types = ["pdf", "excel"]
command = ["./bin/tool", "--fast"]
slots = 3
timeout = 5
"""


def write(tmp_path, text, name="workers.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_good_config_loads_with_paths_relative_to_the_file(tmp_path):
    config = load_config(write(tmp_path, GOOD))
    assert config.supervisor.state_dir == tmp_path / "state"
    assert config.supervisor.shutdown_timeout == 3.0
    assert config.scoring.age == 32.0 and config.scoring.priority == 1024.0
    pdf, tool = config.workers
    assert pdf.processes == 2
    assert tool.command == (str(tmp_path / "bin" / "tool"), "--fast")
    assert tool.slots == 3 and tool.timeout == 5.0
    assert (tool.on_timeout, tool.cancel_grace) == ("retry", 10.0)  # the defaults
    assert config.types == {"pdf", "excel"}
    assert config.control_socket.parent.parent == tmp_path / "state"


def test_on_timeout_and_cancel_grace_are_read(tmp_path):
    text = GOOD.replace("timeout = 5", 'timeout = 5\non_timeout = "fail"\ncancel_grace = 0.5')
    tool = load_config(write(tmp_path, text)).workers[1]
    assert (tool.on_timeout, tool.cancel_grace) == ("fail", 0.5)


@pytest.mark.parametrize("value, seconds", [
    (None, None), ('"30d"', 30 * 86400.0), ('"12h"', 43200.0), ('"1.5m"', 90.0), ("90", 90.0)])
def test_prune_after_takes_an_age_or_seconds(tmp_path, value, seconds):
    text = GOOD if value is None else GOOD.replace(
        "shutdown_timeout = 3", f"shutdown_timeout = 3\nprune_after = {value}")
    assert load_config(write(tmp_path, text)).supervisor.prune_after == seconds


@pytest.mark.parametrize("values, expected", [
    ("", (50 << 20, 3)), ('log_max_bytes = "1MB"\nlog_backups = 0', (1 << 20, 0)),
    ('log_max_bytes = "300 KB"', (300 << 10, 3)), ('log_max_bytes = "2gb"', (2 << 30, 3)),
    ("log_max_bytes = 4096", (4096, 3)), ('log_max_bytes = "0"', (0, 3))])
def test_log_rotation_takes_a_size_in_bytes_or_with_a_unit(tmp_path, values, expected):
    text = GOOD.replace("shutdown_timeout = 3", f"shutdown_timeout = 3\n{values}")
    settings = load_config(write(tmp_path, text)).supervisor
    assert (settings.log_max_bytes, settings.log_backups) == expected


def test_a_command_path_is_taken_from_the_config_folder_a_bare_name_from_path(tmp_path):
    for given, expected in [("bin/tool", str(tmp_path / "bin" / "tool")),
                            ("../up/tool", str(tmp_path.parent / "up" / "tool")),
                            ("/opt/tool", "/opt/tool"), ("tool", "tool")]:
        text = GOOD.replace('"./bin/tool"', f'"{given}"') + 'cwd = "elsewhere"\n'
        config = load_config(write(tmp_path, text))
        assert config.workers[1].command[0] == expected, given


BAD = [
    ("unknown key", GOOD.replace("processes = 2", "procs = 2"), "key 'procs' is not a known setting"),
    ("wrong type", GOOD.replace("processes = 2", 'processes = "two"'), "key 'processes' must be an integer"),
    ("zero slots", GOOD.replace("slots = 3", "slots = 0"), "key 'slots' must be >= 1"),
    ("duplicate name", GOOD.replace('name = "tool"', 'name = "pdf"'), "duplicate name"),
    ("empty types", GOOD.replace('types = ["pdf"]', "types = []"), "key 'types' must not be empty"),
    ("both handler and command", GOOD.replace('handler = "handlers:render_pdf"',
                                              'handler = "handlers:render_pdf"\ncommand = ["x"]'),
     "exactly one of 'handler' or 'command'"),
    ("neither handler nor command", GOOD.replace('handler = "handlers:render_pdf"', ""),
     "exactly one of 'handler' or 'command'"),
    ("bad handler", GOOD.replace("handlers:render_pdf", "handlers.render_pdf"),
     "key 'handler' must look like 'package.module:function'"),
    ("negative timeout", GOOD.replace("timeout = 5", "timeout = -1"), "key 'timeout' must be > 0"),
    ("bad toml", GOOD + "\n[[worker]\n", "invalid TOML"),
    ("no workers", '[supervisor]\nstate_dir = "s"\n', "no [[worker]] tables"),
    ("unknown section", GOOD + "\n[extra]\nx = 1\n", "key 'extra' is not a known setting"),
    ("bad scoring", GOOD.replace("age_weight = 32", "age_weight = 0"), "key 'age_weight' must be > 0"),
    ("boolean as number", GOOD.replace("shutdown_timeout = 3", "shutdown_timeout = true"),
     "key 'shutdown_timeout' must be a number"),
    ("types not strings", GOOD.replace('types = ["pdf"]', "types = [1]"),
     "key 'types' must be a list of non-empty strings"),
    ("unknown scoring key", GOOD.replace("age_weight = 32", "aging = 32"), "key 'aging' is not a known setting"),
    ("name like a process name", GOOD.replace('name = "tool"', 'name = "pdf-2"'),
     "key 'name' must use letters, digits, '_' and '.', not starting with '.' ('-' is for "
     "process names"),
    ("name starting with a dot", GOOD.replace('name = "tool"', 'name = ".tool"'),
     "key 'name' must use letters, digits, '_' and '.', not starting with '.' ('-' is for "
     "process names such as pdf-1), got '.tool'"),
    ("zero start_timeout", GOOD.replace("timeout = 5", "timeout = 5\nstart_timeout = 0"),
     "key 'start_timeout' must be > 0"),
    ("state_dir too deep for a socket", GOOD.replace('state_dir = "state"', 'state_dir = "' + "d" * 120 + '"'),
     "[supervisor] key 'state_dir' is too deep for the control socket"),
    ("nan timeout", GOOD.replace("timeout = 5", "timeout = nan"),
     "key 'timeout' must be a finite number, got nan"),
    ("infinite lease", GOOD.replace("shutdown_timeout = 3", "shutdown_timeout = 3\nlease = inf"),
     "key 'lease' must be a finite number, got inf"),
    ("nan weight", GOOD.replace("age_weight = 32", "age_weight = nan"),
     "[scoring] key 'age_weight' must be a finite number"),
    ("heartbeat too rare for the lease",
     GOOD.replace("shutdown_timeout = 3", "shutdown_timeout = 3\nlease = 6\nheartbeat_interval = 2.5"),
     "key 'heartbeat_interval' must be at most a third of lease (6 s)"),
    ("attempts past the column", GOOD.replace("timeout = 5", "timeout = 5\nmax_attempts = 2147483648"),
     "key 'max_attempts' must be <= 2147483647, got 2147483648"),
    ("heartbeat so frequent it spins",
     GOOD.replace("shutdown_timeout = 3", "shutdown_timeout = 3\nheartbeat_interval = 0.000001"),
     "[supervisor] key 'heartbeat_interval' must be >= 0.1, got 1e-06"),
    ("poll so frequent it spins",
     GOOD.replace("shutdown_timeout = 3", "shutdown_timeout = 3\npoll_interval = 0.000001"),
     "[supervisor] key 'poll_interval' must be >= 0.1, got 1e-06"),
    ("prune_after not an age", GOOD.replace("shutdown_timeout = 3", 'shutdown_timeout = 3\nprune_after = "a month"'),
     "[supervisor] key 'prune_after' must be an age such as 30d, 12h, 45m or 90s, got 'a month'"),
    ("prune_after of a list", GOOD.replace("shutdown_timeout = 3", 'shutdown_timeout = 3\nprune_after = ["30d"]'),
     "[supervisor] key 'prune_after' must be an age such as \"30d\" or a number of seconds, got a list"),
    ("prune_after under a second", GOOD.replace("shutdown_timeout = 3", 'shutdown_timeout = 3\nprune_after = "0.5s"'),
     "[supervisor] key 'prune_after' must be at least 1s, got '0.5s'"),
    ("prune_after of seconds under one", GOOD.replace("shutdown_timeout = 3", "shutdown_timeout = 3\nprune_after = 0"),
     "[supervisor] key 'prune_after' must be >= 1, got 0"),
    ("log_max_bytes not a size", GOOD.replace("shutdown_timeout = 3", 'shutdown_timeout = 3\nlog_max_bytes = "50 megs"'),
     "[supervisor] key 'log_max_bytes' must be a size such as \"50MB\" (B, KB, MB or GB, powers of 1024) or a number of bytes, got '50 megs'"),
    ("log_max_bytes of a float", GOOD.replace("shutdown_timeout = 3", "shutdown_timeout = 3\nlog_max_bytes = 1.5"),
     "[supervisor] key 'log_max_bytes' must be a size such as \"50MB\" or a number of bytes, got number 1.5"),
    ("log_max_bytes too small to rotate by", GOOD.replace("shutdown_timeout = 3", 'shutdown_timeout = 3\nlog_max_bytes = "100B"'),
     "[supervisor] key 'log_max_bytes' must be 0 (never rotate) or at least 1KB, got '100B'"),
    ("log_max_bytes below 0", GOOD.replace("shutdown_timeout = 3", "shutdown_timeout = 3\nlog_max_bytes = -1"),
     "[supervisor] key 'log_max_bytes' must be >= 0, got -1"),
    ("log_backups not an integer", GOOD.replace("shutdown_timeout = 3", 'shutdown_timeout = 3\nlog_backups = "3"'),
     "[supervisor] key 'log_backups' must be an integer, got string '3'"),
    ("log_backups past 1000", GOOD.replace("shutdown_timeout = 3", "shutdown_timeout = 3\nlog_backups = 1001"),
     "[supervisor] key 'log_backups' must be <= 1000, got 1001"),
    ("lease too short to renew", GOOD.replace("shutdown_timeout = 3", "shutdown_timeout = 3\nlease = 1e-9"),
     "[supervisor] key 'lease' must be >= 1, got 1e-09"),
    # Its statement_timeout (a quarter) past PostgreSQL's range, TCP keepalives (a third) past
    # the kernel's: no connection of the supervisor's could be made.
    ("lease too long for the database's timeouts",
     GOOD.replace("shutdown_timeout = 3", "shutdown_timeout = 3\nlease = 1e7"),
     "[supervisor] key 'lease' must be <= 86400, got 10000000.0"),
    ("metrics port past 65535", GOOD.replace("shutdown_timeout = 3",
                                             'shutdown_timeout = 3\nmetrics = "127.0.0.1:99999"'),
     "key 'metrics' must look like 'host:port' or '[ipv6]:port' (port 0 to 65535), got "
     "'127.0.0.1:99999'"),
    ("metrics IPv6 without brackets", GOOD.replace("shutdown_timeout = 3",
                                                   'shutdown_timeout = 3\nmetrics = "::1:9464"'),
     "key 'metrics' must look like 'host:port' or '[ipv6]:port' (port 0 to 65535), got "
     "'::1:9464'"),
    ("metrics host of a label too long",
     GOOD.replace("shutdown_timeout = 3", 'shutdown_timeout = 3\nmetrics = "' + "\\u00fc" * 70 + ':1"'),
     "key 'metrics' has a host that is no host name (a label empty or over 63 characters)"),
    ("environment name with =", GOOD.replace("timeout = 5", 'timeout = 5\nenv = { "A=B" = "c" }'),
     "key 'env' has an entry no environment can hold: 'A=B'"),
    ("environment value with NUL", GOOD.replace("timeout = 5", 'timeout = 5\nenv = { X = "a\\u0000b" }'),
     "key 'env' has an entry no environment can hold: 'X'"),
    ("state_dir with NUL", GOOD.replace('state_dir = "state"', 'state_dir = "st\\u0000ate"'),
     "[supervisor] key 'state_dir' must not hold a NUL character"),
    ("command with NUL", GOOD.replace('"./bin/tool"', '"./bin/to\\u0000ol"'),
     "[[worker]] 'tool' key 'command' must not hold a NUL character"),
    ("command argument with NUL", GOOD.replace('"--fast"', '"--fa\\u0000st"'),
     "[[worker]] 'tool' key 'command' must not hold a NUL character"),
    ("age weight too small to count", GOOD.replace("age_weight = 32", "age_weight = 1e-320"),
     "[scoring] key 'age_weight' is too small beside priority_weight"),
    ("name ending in a line break", GOOD.replace('name = "tool"', 'name = "tool\\n"'),
     "key 'name' must use letters, digits, '_' and '.', not starting with '.' ('-' is for "
     "process names such as pdf-1), got 'tool\\n'"),
    ("type ending in a line break", GOOD.replace('["pdf", "excel"]', '["pdf", "excel\\n"]'),
     "key 'types' has an invalid job type 'excel\\n': a type name is "),
    ("on_timeout of neither kind", GOOD.replace("timeout = 5", 'timeout = 5\non_timeout = "later"'),
     "[[worker]] 'tool' key 'on_timeout' must be \"retry\" or \"fail\", got 'later'"),
    ("on_timeout as a boolean", GOOD.replace("timeout = 5", "timeout = 5\non_timeout = true"),
     "[[worker]] 'tool' key 'on_timeout' must be a non-empty string, got boolean true"),
    ("cancel_grace below 0", GOOD.replace("timeout = 5", "timeout = 5\ncancel_grace = -1"),
     "[[worker]] 'tool' key 'cancel_grace' must be >= 0, got -1.0"),
    ("cancel_grace past a day", GOOD.replace("timeout = 5", "timeout = 5\ncancel_grace = 1e9"),
     "[[worker]] 'tool' key 'cancel_grace' must be <= 86400, got 1000000000.0"),
    ("handler ending in a line break",
     GOOD.replace('"handlers:render_pdf"', '"handlers:render_pdf\\n"'),
     "key 'handler' must look like 'package.module:function', got 'handlers:render_pdf\\n'"),
    ("weight too large", GOOD.replace("age_weight = 32", "age_weight = 32\nrarity_weight = 1e300"),
     "[scoring] key 'rarity_weight' must be <= 1e+12, got 1e+300"),
    ("seconds as an integer past any float",
     GOOD.replace("shutdown_timeout = 3", "shutdown_timeout = 1" + "0" * 400),
     "[supervisor] key 'shutdown_timeout' must be a finite number, got an integer of 401 digits"),
    ("processes as a long integer", GOOD.replace("processes = 2", "processes = 1" + "0" * 30),
     "[[worker]] 'pdf' key 'processes' must be <= 1000, got an integer of 31 digits"),
    ("unknown key holding a line break",
     GOOD.replace("shutdown_timeout = 3", 'shutdown_timeout = 3\n"a\\nb" = 1'),
     "[supervisor] key 'a\\nb' is not a known setting"),
    # Python's own words advised sys.set_int_max_str_digits(), and named no line.
    ("an integer longer than can be read", GOOD.replace("slots = 3", "slots = 1" + "0" * 5000),
     "invalid TOML: an integer of 5001 digits, where numbers take at most 4300 (line 19)"),
    ("an integer longer than can be read, in groups",
     GOOD.replace("slots = 3", "slots = 1" + "_000" * 1500),
     "invalid TOML: an integer of 4501 digits, where numbers take at most 4300 (line 19)"),
    # Was "the input nests too deeply", naming no file.
    ("arrays nested too deeply", GOOD + "\n[scoring.x]\ny = " + "[" * 3000 + "]" * 3000,
     "invalid TOML: arrays or inline tables nested too deeply, one inside another, to be read"),
    ("inline tables nested too deeply", GOOD + "\n[scoring.x]\ny = " + "{a = " * 3000 + "1"
     + "}" * 3000, "invalid TOML: arrays or inline tables nested too deeply"),
]


@pytest.mark.parametrize("text,expected", [(t, e) for _, t, e in BAD], ids=[n for n, _, _ in BAD])
def test_bad_config_raises_one_line(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(str(path)), message
    assert expected in message
    assert "\n" not in message


@pytest.mark.parametrize("text,expected", [(t, e) for _, t, e in BAD], ids=[n for n, _, _ in BAD])
def test_supervise_exits_2_with_one_clear_line(tmp_path, text, expected):
    path = write(tmp_path, text)
    proc = subprocess.run([sys.executable, "-m", "fairsched", "supervise", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert expected in lines[0] and str(path) in lines[0]
    assert "Traceback" not in proc.stderr


def test_debug_shows_the_traceback_before_the_same_line_and_exit_code(tmp_path):
    missing = str(tmp_path / "nope.toml")
    plain = subprocess.run([sys.executable, "-m", "fairsched", "jobs", "--config", missing],
                           capture_output=True, text=True, timeout=60)
    debug = subprocess.run([sys.executable, "-m", "fairsched", "--debug", "jobs", "--config",
                            missing], capture_output=True, text=True, timeout=60)
    assert plain.returncode == debug.returncode == 2
    assert "Traceback" not in plain.stderr
    assert debug.stderr.startswith("Traceback (most recent call last):"), debug.stderr
    assert "ConfigError" in debug.stderr
    assert debug.stderr.splitlines()[-1] == plain.stderr.strip()


def test_commands_of_the_control_socket_do_not_load_the_database_driver(tmp_path):
    """`ps`, `stop` and `restart` start in half the time without psycopg's import."""
    code = (
        "import sys\n"
        "from fairsched.cli import main\n"
        "try:\n"
        f"    main(['ps', '--config', {str(tmp_path / 'nope.toml')!r}])\n"
        "except SystemExit as exc:\n"
        "    print(exc.code, 'psycopg' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["2", "False"], proc.stdout + proc.stderr
    assert "nope.toml: no such file" in proc.stderr


def test_missing_config_file_names_it_and_where_it_came_from(tmp_path):
    def ps(*args, **env):
        proc = subprocess.run([sys.executable, "-m", "fairsched", "ps", *args],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path,
                              env={k: v for k, v in os.environ.items() if k != "FAIRSCHED_CONFIG"}
                              | env)
        assert proc.returncode == 2
        return proc.stderr.strip()

    nope = str(tmp_path / "nope.toml")
    assert ps("--config", nope) == f"fairsched: {nope}: no such file"
    assert ps(FAIRSCHED_CONFIG=nope) == f"fairsched: {nope}: no such file (FAIRSCHED_CONFIG names it)"
    assert ps() == "fairsched: workers.toml: no such file (pass --config or set FAIRSCHED_CONFIG)"


def test_a_config_path_that_is_a_folder_says_so_and_names_the_file_in_it(tmp_path):
    write(tmp_path, GOOD)
    empty = tmp_path / "empty"
    empty.mkdir()
    for command in (["ps"], ["stop"], ["jobs"], ["submit", "pdf"], ["supervise"], ["explain"]):
        for folder, hint in ((tmp_path, f" (--config {tmp_path / 'workers.toml'}?)"),
                             (empty, "")):
            proc = subprocess.run([sys.executable, "-m", "fairsched", *command, "--config",
                                   str(folder)], capture_output=True, text=True, timeout=60)
            assert proc.returncode == 2, (command, proc.stderr)
            assert proc.stderr == (f"fairsched: {folder}: a folder, not a workers.toml file"
                                   f"{hint}\n"), (command, proc.stderr)


def test_a_config_path_with_a_line_break_is_spelled_out_so_each_error_is_one_line(tmp_path):
    # The path was printed as it is: 'fairsched: x' on one line, 'y.toml: no such file' on
    # the next.
    def explain(*args):
        env = {k: v for k, v in os.environ.items() if k != "FAIRSCHED_CONFIG"}
        return subprocess.run([sys.executable, "-m", "fairsched", "explain", *args],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)

    missing = explain("--config", "x\ny.toml")
    assert (missing.returncode, missing.stderr) == (
        2, "fairsched: 'x\\ny.toml': no such file\n")
    folder = tmp_path / "a\nb"
    folder.mkdir()
    bad = write(folder, GOOD.replace("processes = 2", "processes = 0"))
    inside = explain("--config", str(folder))
    assert (inside.returncode, inside.stderr) == (
        2, f"fairsched: {str(folder)!r}: a folder, not a workers.toml file "
           f"(--config {str(bad)!r}?)\n")
    wrong = explain("--config", str(bad))
    assert (wrong.returncode, wrong.stderr) == (
        2, f"fairsched: {str(bad)!r}: [[worker]] 'pdf' key 'processes' must be "
           ">= 1, got 0\n")
    good = write(folder, GOOD)
    weights = explain("--config", str(good))
    assert weights.returncode == 0, weights.stderr
    assert f"[scoring] of {str(good)!r}" in weights.stdout, weights.stdout


def test_a_state_dir_that_is_a_file_is_one_line_not_a_traceback(tmp_path):
    path = write(tmp_path, GOOD)
    (tmp_path / "state").write_text("not a folder")
    for command, code, why in ((["supervise"], 2, "a file is in the way"),
                               (["ps"], 1, "Not a directory"), (["stop"], 1, "Not a directory")):
        proc = subprocess.run([sys.executable, "-m", "fairsched", *command, "--config", str(path)],
                              capture_output=True, text=True, timeout=60)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == code and len(lines) == 1, (command, proc.stderr)
        assert str(tmp_path / "state") in lines[0] and why in lines[0], lines


@pytest.mark.parametrize("args, message", [
    (["bogus"], "No such command 'bogus' (see `python -m fairsched --help`)"),
    (["jobs", "--zzz"], "No such option '--zzz' (see `python -m fairsched jobs --help`)"),
    (["submit"], "Missing argument 'TYPE' (see `python -m fairsched submit --help`)"),
    (["supervise", "--log-level", "loud"], "Invalid value for '--log-level'"),
    (["jobs", "--config", ""], "--config is empty"),
    # An option of a command before the command's name, as supervisorctl -c takes it.
    (["--config", "w.toml", "ps"], "fairsched: --config goes after the command's name, as in "
     "`python -m fairsched ps --config ...` (see `python -m fairsched ps --help`)\n"),
    (["--json", "jobs", "--status", "failed"], "fairsched: --json goes after the command's "
     "name, as in `python -m fairsched jobs --json ...`"),
    (["--config=w.toml"], "as in `python -m fairsched COMMAND --config ...`"),
    (["--bogus", "ps"], "No such option '--bogus' (see `python -m fairsched --help`)"),
])
def test_usage_errors_are_one_line_exit_2(args, message):
    proc = subprocess.run([sys.executable, "-m", "fairsched", *args], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("fairsched: ") and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_help_and_version_still_exit_0():
    for args in (["--help"], ["ps", "--help"], ["--version"]):
        proc = subprocess.run([sys.executable, "-m", "fairsched", *args], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout and not proc.stderr, (args, proc.stderr)


def test_a_database_url_that_is_not_one_is_a_configuration_error(tmp_path):
    path = write(tmp_path, GOOD)
    env = dict(os.environ, FAIRSCHED_DATABASE_URL="garbage://")
    for command in (["jobs"], ["submit", "pdf"], ["supervise"]):
        proc = subprocess.run([sys.executable, "-m", "fairsched", *command, "--config", str(path)],
                              capture_output=True, text=True, timeout=60, env=env)
        assert proc.returncode == 2, (command, proc.stderr)
        (line,) = proc.stderr.strip().splitlines()  # supervise starts no worker first
        assert line.startswith("fairsched: FAIRSCHED_DATABASE_URL is not a PostgreSQL URL"), line


def test_a_slow_database_cannot_outlast_the_lease_between_two_heartbeats():
    # The longest gap between two heartbeats: the longest interval the config allows, plus a
    # round that answered just in time. It must end well before the supervisor gives its jobs
    # back, or a database that is slow but answering would stop long jobs again and again.
    from fairsched.supervisor.lease import CANCEL_AT, KILL_AT
    from fairsched.supervisor.queue_link import ANSWER_WITHIN

    assert 1 / 3 + ANSWER_WITHIN <= CANCEL_AT - 0.05 < KILL_AT


@pytest.mark.parametrize("command", [["ps"], ["stop"], ["restart", "pdf"],
                                     ["submit", "pdf", "--on-demand"]])
def test_a_state_dir_too_deep_for_a_socket_is_the_config_error_for_socket_commands(tmp_path,
                                                                                  command):
    # As for supervise and the queue commands: one line naming the key, exit 2, not
    # 'cannot reach a supervisor ...: AF_UNIX path too long' with exit 1.
    path = write(tmp_path, GOOD.replace('state_dir = "state"', 'state_dir = "' + "d" * 120 + '"'))
    result = subprocess.run([sys.executable, "-m", "fairsched", *command, "--config", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "[supervisor] key 'state_dir' is too deep for the control socket" in result.stderr


def test_a_byte_order_mark_at_the_start_of_workers_toml_is_read_past(tmp_path):
    # Editors on Windows write one before the first line; it was "invalid TOML: Invalid
    # statement (at line 1, column 1)", for ps and stop as much as for supervise.
    path = tmp_path / "workers.toml"
    path.write_bytes(b"\xef\xbb\xbf" + textwrap.dedent(GOOD).encode())
    config = load_config(path)
    assert [w.name for w in config.workers] == ["pdf", "tool"]
    assert config.scoring.age == 32
    explained = subprocess.run([sys.executable, "-m", "fairsched", "explain", "--config",
                                str(path)], capture_output=True, text=True, timeout=60)
    assert (explained.returncode, explained.stderr) == (0, "")
    assert f"[scoring] of {path}" in explained.stdout, explained.stdout
    stopped = subprocess.run([sys.executable, "-m", "fairsched", "stop", "--config", str(path)],
                             capture_output=True, text=True, timeout=60)
    assert (stopped.returncode, stopped.stderr) == (
        0, f"fairsched: no supervisor is running on {tmp_path / 'state' / 'control' / 'sock'}:"
           " nothing to stop\n")
