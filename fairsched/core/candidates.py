"""The jobs competing for slots in one planning cycle, held column-wise in typed arrays.

Both implementations read the columns in bulk (the compiled one as typed memoryviews).
"""

import math
from array import array
from numbers import Real


def _time(value, what):
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{what} must be a number of seconds, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number of seconds, got {value!r}")
    return value


def _int_column(name, values):
    try:
        return array("q", values)
    except (TypeError, OverflowError) as exc:
        raise ValueError(f"candidate {name} must be 64-bit integers ({exc})") from None


class Candidates:
    """Candidate jobs: type id, priority, eligible_at (seconds), on-demand flag, job id and
    tenant id; and `tenant_shares`, each tenant id's share of the recent usage (0 .. 1).

    Type ids are the pool's interned ids; an id the pool does not know makes the job
    unplaceable, nothing worse. Job ids only break ties, so any 64-bit integers will do.
    Tenant ids index tenant_shares; a job whose tenant id has no share (-1, the default)
    gets no tenant term.
    """

    __slots__ = ("types", "priorities", "eligible_at", "on_demand", "job_ids", "tenants",
                 "tenant_shares")

    def __init__(self):
        self.types = array("q")
        self.priorities = array("q")
        self.eligible_at = array("d")
        self.on_demand = array("B")
        self.job_ids = array("q")
        self.tenants = array("q")
        self.tenant_shares = array("d")

    def append(self, type_id, priority, eligible_at, on_demand, job_id, tenant=-1):
        eligible_at = _time(eligible_at, "eligible_at")
        # Convert everything before appending anything so a bad value leaves no ragged row
        # (the flag too: a value with no truth value, like pandas.NA, raises on bool()).
        row = _int_column("type_id, priority, job_id and tenant",
                          (type_id, priority, job_id, tenant))
        flag = 1 if on_demand else 0
        self.types.append(row[0])
        self.priorities.append(row[1])
        self.eligible_at.append(eligible_at)
        self.on_demand.append(flag)
        self.job_ids.append(row[2])
        self.tenants.append(row[3])

    @classmethod
    def from_lists(cls, types, priorities, eligible_at, on_demand, ids, tenants=None,
                   tenant_shares=None):
        self = cls()
        self.types = _int_column("types", types)
        self.priorities = _int_column("priorities", priorities)
        try:
            self.eligible_at = array("d", eligible_at)
        except TypeError as exc:
            raise TypeError(f"candidate eligible_at must be numbers of seconds ({exc})") from None
        if not all(map(math.isfinite, self.eligible_at)):
            bad = next(v for v in self.eligible_at if not math.isfinite(v))
            raise ValueError(f"candidate eligible_at must be finite numbers of seconds, got {bad!r}")
        self.on_demand = array("B", [1 if flag else 0 for flag in on_demand])
        self.job_ids = _int_column("ids", ids)
        self.tenants = (array("q", [-1]) * len(self.job_ids) if tenants is None
                        else _int_column("tenants", tenants))
        if tenant_shares is not None:
            self.tenant_shares = array("d", tenant_shares)
        lengths = [len(self.types), len(self.priorities), len(self.eligible_at),
                   len(self.on_demand), len(self.job_ids), len(self.tenants)]
        if len(set(lengths)) != 1:
            raise ValueError("types, priorities, eligible_at, on_demand, ids and tenants must "
                             f"have the same length, got {', '.join(map(str, lengths))}")
        return self

    def __len__(self):
        return len(self.types)

    def __repr__(self):
        return f"<Candidates: {len(self)} jobs>"
