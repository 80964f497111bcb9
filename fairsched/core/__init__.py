"""The scheduling core: slot pool, scoring, cycle planning and the candidate cache, compiled
or pure Python.

The compiled modules (_pool_c, _scoring_c, _matching_c, _cache_c) are used when they load;
the pure-Python twins (_pool_py, _scoring_py, _matching_py, _cache_py) have the same API and
give the same results. FAIRSCHED_NO_EXTENSIONS=1 forces the twins, as does any interpreter other
than CPython. `__impl__` says which one is live ("c" or "python").
"""

import os
import sys
from types import SimpleNamespace

from fairsched.core import _cache_py, _matching_py, _pool_py, _scoring_py
from fairsched.core.candidates import Candidates
from fairsched.core.weights import Weights

__all__ = [
    "CandidateCache",
    "Candidates",
    "SlotPool",
    "Weights",
    "__impl__",
    "implementations",
    "plan_cycle",
    "score_candidates",
]


def _namespace(impl, pool, scoring, matching, candidate_cache):
    return SimpleNamespace(
        impl=impl,
        SlotPool=pool.SlotPool,
        CandidateCache=candidate_cache,
        Weights=Weights,
        Candidates=Candidates,
        score_candidates=scoring.score_candidates,
        plan_cycle=matching.plan_cycle,
        plan_optimal=matching.plan_optimal,
    )


_PYTHON = _namespace("python", _pool_py, _scoring_py, _matching_py, _cache_py.CandidateCache)
_COMPILED = None
_compiled_error = None


def _load_compiled():
    global _COMPILED, _compiled_error
    if _COMPILED is None and _compiled_error is None:
        if sys.implementation.name != "cpython":
            _compiled_error = f"not available on {sys.implementation.name}"
        else:
            try:
                from fairsched.core import _matching_c, _pool_c, _scoring_c
                from fairsched.core._cache_c import CandidateCache  # built on the three
            except ImportError as exc:
                _compiled_error = str(exc)
            else:
                _COMPILED = _namespace("c", _pool_c, _scoring_c, _matching_c, CandidateCache)
    return _COMPILED


def implementations():
    """{"c": compiled namespace or None when it does not load, "py": the twin}.

    The compiled namespace is offered whenever it loads, even under
    FAIRSCHED_NO_EXTENSIONS=1 (which only decides the live implementation), so the two
    can be compared side by side. Each namespace has impl, SlotPool, CandidateCache, Weights,
    Candidates, score_candidates, plan_cycle and plan_optimal.
    """
    return {"c": _load_compiled(), "py": _PYTHON}


def compiled_error():
    """Why the compiled core did not load, or None."""
    _load_compiled()
    return _compiled_error


if os.environ.get("FAIRSCHED_NO_EXTENSIONS") == "1":
    _live = _PYTHON
else:
    _live = _load_compiled() or _PYTHON

__impl__ = _live.impl
SlotPool = _live.SlotPool
CandidateCache = _live.CandidateCache
score_candidates = _live.score_candidates
plan_cycle = _live.plan_cycle
plan_optimal = _live.plan_optimal
