"""What the core benchmarks (bench_core.py, bench_cycle.py) share: their command line and the
check that the compiled core loaded, which they time beside its twin."""

import argparse
import sys

from fairsched.core import compiled_error, implementations


def start(doc, quick_help, argv=None):
    """The arguments (--quick alone) and both cores, {"c": ..., "py": ...}; the cores are None,
    said on stderr, when the compiled one did not load."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    args = parser.parse_args(argv)
    impls = implementations()
    if impls["c"] is None:
        print(f"error: the compiled core did not load ({compiled_error()}); run `make build`",
              file=sys.stderr)
        return args, None
    return args, impls
