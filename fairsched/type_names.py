"""The one rule for job type names, which workers.toml, `submit` and the Queue API all apply:
a type no configuration can run, or one too long for a notification, is refused where it is
given, with the same message."""

from __future__ import annotations

import re
from typing import Any

MAX_TYPE_NAME = 64  # characters; pg_notify carries the type, and a group lists its types
TYPE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/-]*")
RULE = (f"letters, digits and _.:/- (the first a letter, digit or _), at most {MAX_TYPE_NAME} "
        "characters")
SHOWN = 40  # characters of a bad name a message quotes


def type_name_problem(name: Any) -> str | None:
    """What is wrong with `name` as a job type, as one line; None when nothing is."""
    if isinstance(name, str) and len(name) <= MAX_TYPE_NAME and TYPE_NAME.fullmatch(name):
        return None
    return f"invalid job type {_shown(name)}: a type name is {RULE}"


def check_type_name(name: Any) -> None:
    """ValueError saying what is wrong with `name` as a job type, if anything."""
    problem = type_name_problem(name)
    if problem is not None:
        raise ValueError(problem)


def _shown(name: Any) -> str:
    """A bad name as a one-line message quotes it: control characters spelled out, and a
    long one cut, with its length."""
    if not isinstance(name, str):
        return f"{name!r:.{SHOWN}} ({type(name).__name__}, not a string)"
    if len(name) <= SHOWN:
        return repr(name)
    return f"{name[:SHOWN]!r}... ({len(name)} characters)"


def tenant_name_problem(name: Any) -> str | None:
    """What is wrong with `name` as a tenant, as one line; None when nothing is. A tenant
    name follows the type name rule."""
    if isinstance(name, str) and len(name) <= MAX_TYPE_NAME and TYPE_NAME.fullmatch(name):
        return None
    return f"invalid tenant {_shown(name)}: a tenant name is {RULE}"


def check_tenant_name(name: Any) -> None:
    """ValueError saying what is wrong with `name` as a tenant, if anything."""
    problem = tenant_name_problem(name)
    if problem is not None:
        raise ValueError(problem)
