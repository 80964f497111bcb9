"""The job store: the durable queue in PostgreSQL (embedded or by URL), its schema and clients."""

from fairsched.store.aqueue import AsyncStore, Candidate, QueuedJob, retry_delay
from fairsched.store.database import Database, open_database
from fairsched.store.errors import (
    DatabaseUnavailable,
    JobNotFound,
    JobStateError,
    SchemaError,
    StoreError,
)
from fairsched.store.queue import Queue

__all__ = [
    "AsyncStore",
    "Candidate",
    "Database",
    "DatabaseUnavailable",
    "JobNotFound",
    "JobStateError",
    "Queue",
    "QueuedJob",
    "SchemaError",
    "StoreError",
    "open_database",
    "retry_delay",
]
