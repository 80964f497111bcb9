"""Argument checks shared by the compiled core and its twin, so both fail the same way."""

import math
from array import array

from fairsched.core.candidates import Candidates, _time
from fairsched.core.weights import Weights

# Type ids index per-type arrays, so they must stay small: the caller interns type names.
MAX_TYPE_ID = (1 << 20) - 1
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


def check_now(now):
    return _time(now, "now")


def check_weights(weights):
    if not isinstance(weights, Weights):
        raise TypeError(f"weights must be a fairsched.core.Weights, got {type(weights).__name__}")
    return (weights.priority, weights.age, weights.rarity, weights.on_demand,
            weights.on_demand_age, weights.tenant)


def check_candidates(cands):
    if not isinstance(cands, Candidates):
        raise TypeError(f"cands must be a fairsched.core.Candidates, got {type(cands).__name__}")
    n = len(cands.types)
    if not (len(cands.priorities) == len(cands.eligible_at) == len(cands.on_demand)
            == len(cands.job_ids) == len(cands.tenants) == n):
        raise ValueError("candidate columns have different lengths")
    return n


def check_shares(shares):
    """Tenant usage shares by tenant id as array('d'), each between 0 and 1."""
    if shares is None:
        return array("d")
    if not (isinstance(shares, array) and shares.typecode == "d"):
        try:
            shares = array("d", shares)
        except TypeError as exc:
            raise TypeError(f"tenant shares must be numbers ({exc})") from None
    for v in shares:
        if not 0.0 <= v <= 1.0:  # NaN fails this too
            raise ValueError(f"a tenant share must be between 0 and 1, got {v!r}")
    return shares


def check_matching(matching):
    if matching not in ("greedy", "optimal"):
        raise ValueError(f"matching must be 'greedy' or 'optimal', got {matching!r}")


def as_free_counts(free_counts):
    """Free slot counts per type id as array('q'); SlotPool.free_counts() already is one."""
    if isinstance(free_counts, array) and free_counts.typecode == "q":
        return free_counts
    try:
        return array("q", free_counts)
    except (TypeError, OverflowError) as exc:
        raise TypeError(f"free_counts must be a sequence of 64-bit integers ({exc})") from None


def as_int64(value, what):
    """The integer conversion Cython applies to an int64_t argument, with a better message."""
    try:
        value = value.__index__()
    except AttributeError:
        raise TypeError(f"{what} must be an integer, got {value!r}") from None
    if not INT64_MIN <= value <= INT64_MAX:
        raise OverflowError(f"{what} {value} does not fit in 64 bits")
    return value


def check_slot_id(slot_id):
    slot_id = as_int64(slot_id, "slot id")
    if slot_id < 0:
        # -1 is what acquire() returns for "no slot".
        raise ValueError(f"slot id must be >= 0, got {slot_id}")
    return slot_id


def check_type_ids(type_ids):
    if isinstance(type_ids, str | bytes) or not hasattr(type_ids, "__iter__"):
        raise TypeError(f"type_ids must be a sequence of integers, got {type_ids!r}")
    out = []
    for t in type_ids:
        t = as_int64(t, "type id")
        if not 0 <= t <= MAX_TYPE_ID:
            raise ValueError(f"type id must be between 0 and {MAX_TYPE_ID}, got {t}")
        out.append(t)
    if not out:
        raise ValueError("a slot needs at least one type id, got none")
    if len(set(out)) != len(out):
        dup = next(t for t in out if out.count(t) > 1)
        raise ValueError(f"type id {dup} is listed twice for one slot")
    return tuple(out)


def check_offset(offset):
    return _time(offset, "offset")


def _check_type_id(type_id):
    if not 0 <= type_id <= MAX_TYPE_ID:
        raise ValueError(f"type id must be between 0 and {MAX_TYPE_ID}, got {type_id}")
    return type_id


def check_row(job_id, type_id, priority, eligible_at):
    """One candidate cache row, converted as both implementations store it."""
    return (as_int64(job_id, "job id"), _check_type_id(as_int64(type_id, "type id")),
            as_int64(priority, "priority"), _time(eligible_at, "eligible_at"))


def _int_column(values, what):
    try:
        return array("q", values)
    except (TypeError, OverflowError) as exc:
        raise ValueError(f"{what} must be 64-bit integers ({exc})") from None


def check_rows(job_ids, type_ids, priorities, eligible_at, jobs):
    """Candidate cache rows given column by column: (job ids, type ids, priorities as
    array('q'), eligible_at as array('d'), jobs as a list), all of one length."""
    ids = _int_column(job_ids, "job ids")
    types = _int_column(type_ids, "type ids")
    prios = _int_column(priorities, "priorities")
    try:
        times = array("d", eligible_at)
    except TypeError as exc:
        raise TypeError(f"eligible_at must be numbers of seconds ({exc})") from None
    jobs = list(jobs)
    lengths = [len(ids), len(types), len(prios), len(times), len(jobs)]
    if len(set(lengths)) != 1:
        raise ValueError("job_ids, type_ids, priorities, eligible_at and jobs must have the "
                         f"same length, got {', '.join(map(str, lengths))}")
    if types and (min(types) < 0 or max(types) > MAX_TYPE_ID):
        _check_type_id(min(types) if min(types) < 0 else max(types))
    if not all(map(math.isfinite, times)):
        bad = next(v for v in times if not math.isfinite(v))
        raise ValueError(f"eligible_at must be finite numbers of seconds, got {bad!r}")
    return ids, types, prios, times, jobs


def check_tenants(tenants, n):
    """Tenant ids for n rows as array('q') (None: n times -1, no tenant)."""
    if tenants is None:
        return array("q", [-1]) * n
    out = _int_column(tenants, "tenant ids")
    if len(out) != n:
        raise ValueError(f"tenants must have one id per row: {len(out)} for {n} rows")
    return out


def as_job_id(job_id):
    """job_id as a 64-bit integer, or None for anything else (looked up, it is just absent)."""
    try:
        return as_int64(job_id, "job id")
    except (TypeError, OverflowError):
        return None
