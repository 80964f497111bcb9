"""Build the compiled scheduling core and the worker's fork helper; everything else is plain
Python."""

import os
import sys

from setuptools import Extension, setup

DEBUG = os.environ.get("FAIRSCHED_CYTHON_DEBUG") == "1"

directives = {
    "language_level": 3,
    "embedsignature": True,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "cdivision": True,
    "initializedcheck": DEBUG,
    "linetrace": DEBUG,
}
macros = [("CYTHON_TRACE", "1")] if DEBUG else []
# Scores must be bit-identical with the pure-Python twin: no fused multiply-add contraction.
compile_args = ["-O2", "-ffp-contract=off"]

# The longest to compile first: with one compiler per core, the other two share the second.
CORE_MODULES = ["_scoring_c", "_matching_c", "_pool_c", "_cache_c", "_idmap_c"]
# Modules by path: the core's, then the template's fork_orphan (fairsched/worker/orphan.py).
MODULES = [f"core/{name}" for name in CORE_MODULES] + ["worker/_orphan_c"]


def extensions():
    """The core's extensions and the command that builds them, or none with the twin only."""
    if os.environ.get("FAIRSCHED_NO_EXTENSIONS") == "1" or sys.implementation.name != "cpython":
        return [], {}
    # A wheel without the compiled core would install and run, slower, with nothing saying
    # so: a missing source or Cython stops the build instead.
    sources = [f"fairsched/{module}.pyx" for module in MODULES]
    missing = [path for path in sources if not os.path.exists(path)]
    if missing:
        sys.exit(f"error: the compiled core's source {', '.join(missing)} is missing; "
                 "set FAIRSCHED_NO_EXTENSIONS=1 to build fairsched with its pure-Python core only")
    try:
        from Cython.Build import build_ext
    except ImportError:
        sys.exit("error: Cython is needed to build the compiled core (pip install 'Cython>=3.0'); "
                 "set FAIRSCHED_NO_EXTENSIONS=1 to build fairsched with its pure-Python core only")

    exts = []
    for module, source in zip(MODULES, sources, strict=True):
        ext = Extension(f"fairsched.{module.replace('/', '.')}", [source], define_macros=macros,
                        extra_compile_args=compile_args)
        ext.cython_directives = directives
        exts.append(ext)
    # Cython's build_ext translates the .pyx when the extension is built, not when setup.py
    # is read: making the sdist runs no Cython.
    return exts, {"build_ext": build_ext}


ext_modules, cmdclass = extensions()
setup(
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    # Six modules, each built apart: one compiler per core makes a first build shorter.
    options={"build_ext": {"parallel": min(len(MODULES), os.cpu_count() or 1)}},
)
