"""Exceptions shared by the supervisor, the workers and the command line."""


class FairschedError(Exception):
    """Base class for errors fairsched reports to its users as one line."""


class ConfigError(FairschedError):
    """workers.toml is wrong: the message names the file, the key and the problem."""


class PermanentError(Exception):
    """Raised by a handler for a failure that must not be retried."""


def path_name(path) -> str:
    """A path as a message or a table names it: as it is, or, with a line break or other
    control character in it, as Python spells it ('a\\nb.toml'), so the line stays one line."""
    text = str(path)
    return text if text.isprintable() else repr(text)
