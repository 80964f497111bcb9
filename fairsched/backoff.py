"""Geometric backoff, the one formula behind every wait that grows while something keeps failing:
worker restarts, job retries (their run_after), database reconnections, replacements of a
template or of the lease watchdog. As systemd's RestartSteps/RestartMaxDelaySec: each wait
doubles the one before, up to a ceiling.
"""

from __future__ import annotations

import math
import random


def backoff(step: int, first: float, ceiling: float, *, jitter: str | None = None,
            rng=random) -> float:
    """Seconds of the wait that follows `step` waits in a row (0 for the first): `first`
    doubled `step` times, at most `ceiling`.

    Jitter spreads waiters that would otherwise act in lockstep (jobs failed together):
    "equal" draws from [d/2, d], keeping a floor; "full" from [0, d].
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    if not (math.isfinite(first) and first >= 0 and math.isfinite(ceiling) and ceiling >= 0):
        raise ValueError(f"first and ceiling must be finite and >= 0, got {first!r}, {ceiling!r}")
    # Doubling is exact in binary floating point: the same waits as doubling the last one.
    # 2.0 ** step overflows past 1023 steps; 2^1000 times any first wait is past any ceiling.
    delay = min(ceiling, first * 2.0 ** min(step, 1000))
    if jitter is None:
        return delay
    if jitter == "equal":
        return delay / 2 + rng.uniform(0.0, delay / 2)
    if jitter == "full":
        return rng.uniform(0.0, delay)
    raise ValueError(f"jitter must be 'equal', 'full' or None, got {jitter!r}")
