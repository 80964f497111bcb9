"""`python -m fairsched` and the `fairsched` command: the command line, Ctrl-C included.

The command line takes a tenth of a second to import; Ctrl-C then ends it with the same one
line as during a command, not with a traceback of the import it cut short.
"""

import sys


def run() -> None:
    try:
        from fairsched.cli import main
    except KeyboardInterrupt:
        start = "\n" if sys.stderr.isatty() else ""  # below the "^C" a terminal echoed
        print(f"{start}fairsched: interrupted", file=sys.stderr)
        sys.exit(130)
    main()


if __name__ == "__main__":
    run()
