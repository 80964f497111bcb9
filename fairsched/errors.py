"""Exceptions shared by the supervisor, the workers and the command line."""

import sys


class FairschedError(Exception):
    """Base class for errors fairsched reports to its users as one line."""


class ConfigError(FairschedError):
    """workers.toml is wrong: the message names the file, the key and the problem."""


class PermanentError(Exception):
    """Raised by a handler for a failure that must not be retried."""


class LongInteger(ValueError):
    """An integer of more digits than Python reads (int()'s limit, 4300 unless
    PYTHONINTMAXSTRDIGITS says otherwise), said without Python's advice to raise that limit,
    which a user of fairsched cannot follow."""


def long_integer(digits: int) -> str:
    return (f"an integer of {digits} digits, where numbers take at most "
            f"{sys.get_int_max_str_digits()}")


def read_int(token: str) -> int:
    """int(token), for json.loads(parse_int=...): LongInteger for one too long to read."""
    limit = sys.get_int_max_str_digits()
    digits = len(token) - token.startswith("-")
    if limit and digits > limit:
        raise LongInteger(long_integer(digits))
    return int(token)


def given(text: str, limit: int = 40) -> str:
    """What a user typed, as a message quotes it back: whole up to `limit` characters, else
    its start and its length (a number of 5,000 digits is no line to read)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def path_name(path) -> str:
    """A path as a message or a table names it: as it is, or, with a line break or other
    control character in it, as Python spells it ('a\\nb.toml'), so the line stays one line."""
    text = str(path)
    return text if text.isprintable() else repr(text)
