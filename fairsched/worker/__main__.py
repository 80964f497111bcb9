"""`python -m fairsched.worker [--chdir DIR]`: run one Python worker (see docs/protocol.md).

With `--template` it is instead a handler group's template, started by the supervisor's Template
(fairsched.supervisor.template_process).
"""

import sys


def _main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--template"]:
        from fairsched.worker.template import main

        main(args[1:])
    from fairsched.worker.runtime import main

    main(args)


if __name__ == "__main__":
    _main()
