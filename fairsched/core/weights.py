"""Scoring weights, shared by the compiled core and its pure-Python twin."""

import math
from dataclasses import dataclass, fields
from numbers import Real


@dataclass(frozen=True, slots=True)
class Weights:
    """The `[scoring]` weights (docs/scheduling.md), in points.

    score = priority x `priority` + age x `age` + `rarity` / free compatible slots
            + (on-demand: `on_demand` + age x `on_demand_age`)
            - `tenant` x (tenant's usage share - lowest share among the candidates)
    """

    priority: float = 1024.0
    age: float = 16.0
    rarity: float = 500.0
    on_demand: float = 4096.0
    on_demand_age: float = 32.0
    tenant: float = 16384.0

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, Real):
                raise TypeError(f"weight {f.name} must be a number, got {value!r}")
            value = float(value)
            # A negative or infinite weight would break the bounded-wait guarantee.
            if not math.isfinite(value) or value < 0.0:
                raise ValueError(f"weight {f.name} must be a finite number >= 0, got {value!r}")
            object.__setattr__(self, f.name, value)
