"""Errors of the job store, each reported to users as one line."""

from fairsched.errors import ConfigError, FairschedError


class StoreError(FairschedError):
    """The job store could not do what was asked."""


class DatabaseUnavailable(StoreError):
    """PostgreSQL could not be started or reached."""


class BadDatabaseURL(StoreError, ConfigError):
    """FAIRSCHED_DATABASE_URL or the `database` setting is not a connection string: exit 2."""


class BadStateDir(DatabaseUnavailable, ConfigError):
    """The embedded PostgreSQL cannot live in state_dir as configured: exit 2."""


class OtherDatabase(StoreError, ConfigError):
    """A supervisor runs on this state_dir with an external database, which this command was
    not given: the embedded one it would open there is read by no supervisor. Exit 2."""


class SchemaError(StoreError):
    """The database schema is not one this version of fairsched can use."""


class SchemaTooNew(SchemaError, ConfigError):
    """The database was upgraded by a newer fairsched: running this one is bad usage, exit 2."""


class JobNotFound(StoreError, LookupError):
    """No job has the given id."""

    def __init__(self, job_id: int):
        super().__init__(f"no job with id {job_id}")
        self.job_id = job_id


class JobStateError(StoreError, ValueError):
    """The job exists but its status does not allow the operation."""


class KeyConflict(StoreError):
    """An enqueue named an idempotency key that an unfinished job holds, or that another job
    of the same call names, with a job that is not that one (another type, payload or
    priority): nothing of the call was queued. `key`, the key; `job_id`, the unfinished job
    holding it (None when the other job is one of the call's); `index`, the position in the
    call of the job refused."""

    def __init__(self, message: str, key: str, job_id: int | None, index: int):
        super().__init__(message)
        self.key = key
        self.job_id = job_id
        self.index = index
