"""What `make` needs before it creates .venv: Python 3.11 or later with venv and its headers,
and a C compiler. Says what is missing in one line and exits 1; silent when all is there.

It runs on the interpreter it checks, which may be an old one: the syntax stays that of
Python 2.7 and 3.0 (no f-strings, no annotations).
"""
# ruff: noqa: UP031

import os
import platform
import shlex
import shutil
import sys
import sysconfig

NEEDED = (3, 11)


def fail(problem):
    sys.stderr.write("fairsched: " + problem + "\n")
    sys.exit(1)


def check_python():
    if sys.version_info[:2] < NEEDED:
        fail("Python %s (%s) is too old: fairsched needs Python %d.%d or later "
             "(make run PYTHON=python3.11 picks another interpreter)"
             % (platform.python_version(), sys.executable, NEEDED[0], NEEDED[1]))
    try:
        import ensurepip  # noqa: F401
    except ImportError:
        fail("Python's venv cannot install pip here (no ensurepip in %s): install its venv "
             "support (Debian and Ubuntu: python3-venv)" % sys.executable)
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        fail("Python's C headers are missing (no Python.h in %s), needed to compile the "
             "core: install them (Debian and Ubuntu: python3-dev)" % include)


def check_compiler():
    # The compiler setuptools will call: $CC, else the one this Python was built with.
    command = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    words = shlex.split(command)
    if not words or shutil.which(words[0]) is None:
        fail("no C compiler: %r (%s) is not on PATH; install one (Debian and Ubuntu: gcc) or "
             "set CC" % (words[0] if words else command,
                         "$CC" if os.environ.get("CC") else "the compiler Python was built with"))


if __name__ == "__main__":
    check_python()
    check_compiler()
