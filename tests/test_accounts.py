"""The second account the security tests use is a real, unprivileged one."""

import os

import pytest

from tests.accounts import STRANGER, StrangerFailed, as_stranger, stranger_account


def test_the_stranger_is_not_root_and_cannot_read_a_private_file(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("x")
    secret.chmod(0o600)
    assert as_stranger(os.geteuid) == stranger_account().pw_uid != 0
    assert as_stranger(os.getgroups) == []
    with pytest.raises(StrangerFailed, match="PermissionError"):
        as_stranger(open, str(secret))
    assert STRANGER in as_stranger(lambda: os.environ["USER"])
