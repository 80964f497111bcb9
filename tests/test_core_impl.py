"""Which core is live: the compiled one when expected, the twin when asked for or missing."""

import os
import subprocess
import sys

import fairsched.core as core
from fairsched.core import _pool_py, compiled_error, implementations


def test_compiled_core_is_live_when_required():
    impls = implementations()
    if os.environ.get("FAIRSCHED_REQUIRE_EXTENSIONS") == "1":
        assert os.environ.get("FAIRSCHED_NO_EXTENSIONS") != "1", \
            "FAIRSCHED_REQUIRE_EXTENSIONS=1 and FAIRSCHED_NO_EXTENSIONS=1 contradict each other"
        assert core.__impl__ == "c", f"compiled core expected, not loaded: {compiled_error()}"
        assert impls["c"] is not None
    else:
        assert core.__impl__ in ("c", "python")
    live = impls["c"] if core.__impl__ == "c" else impls["py"]
    assert live is not None
    assert core.SlotPool is live.SlotPool
    assert core.CandidateCache is live.CandidateCache
    assert core.score_candidates is live.score_candidates
    assert core.plan_cycle is live.plan_cycle
    assert impls["py"].SlotPool is _pool_py.SlotPool
    if os.environ.get("FAIRSCHED_NO_EXTENSIONS") != "1":
        # The compiled core is live exactly when it loads.
        assert (core.__impl__ == "c") == (impls["c"] is not None)


def _impl_in_child(env_extra, prelude=""):
    env = {k: v for k, v in os.environ.items()
           if k not in ("FAIRSCHED_NO_EXTENSIONS", "FAIRSCHED_REQUIRE_EXTENSIONS")}
    env.update(env_extra)
    code = (prelude + "import fairsched.core as c\n"
            "print(c.__impl__, type(c.SlotPool()).__module__)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    return out.stdout.split()


def test_no_extensions_forces_the_twin():
    assert _impl_in_child({"FAIRSCHED_NO_EXTENSIONS": "1"}) == ["python",
                                                              "fairsched.core._pool_py"]


def test_import_error_falls_back_to_the_twin():
    # A None entry in sys.modules makes that import raise ImportError.
    prelude = "import sys\nsys.modules['fairsched.core._pool_c'] = None\n"
    assert _impl_in_child({}, prelude) == ["python", "fairsched.core._pool_py"]
