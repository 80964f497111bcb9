"""Exceptions shared by the supervisor, the workers and the command line."""


class FairschedError(Exception):
    """Base class for errors fairsched reports to its users as one line."""


class ConfigError(FairschedError):
    """workers.toml is wrong: the message names the file, the key and the problem."""


class PermanentError(Exception):
    """Raised by a handler for a failure that must not be retried."""
