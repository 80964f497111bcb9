"""Build the compiled scheduling core; everything else is plain Python."""

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

CORE_MODULES = ["_pool_c", "_scoring_c", "_matching_c"]


def extensions():
    if os.environ.get("FAIRSCHED_NO_EXTENSIONS") == "1" or sys.implementation.name != "cpython":
        return []
    from Cython.Build import cythonize

    exts = [
        Extension(
            f"fairsched.core.{name}",
            [f"fairsched/core/{name}.pyx"],
            define_macros=macros,
            extra_compile_args=compile_args,
        )
        for name in CORE_MODULES
        if os.path.exists(f"fairsched/core/{name}.pyx")
    ]
    return cythonize(exts, compiler_directives=directives, quiet=True)


setup(ext_modules=extensions())
