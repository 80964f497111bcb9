"""The job store: the durable queue in PostgreSQL (embedded or by URL), its schema and clients.

The names below load their module on first use, so that importing one part (the schema's
constants, say) does not import the database driver.
"""

import importlib

_HOMES = {
    "AsyncStore": "aqueue", "Candidate": "rows", "QueuedJob": "rows",
    "Database": "database", "open_database": "database",
    "DatabaseUnavailable": "errors", "JobNotFound": "errors", "JobStateError": "errors",
    "KeyConflict": "errors", "SchemaError": "errors", "StoreError": "errors",
    "Queue": "queue",
}

__all__ = sorted(_HOMES)


def __getattr__(name):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
