"""The `fairsched` command line: a click group; each command module registers itself."""

import click

from fairsched import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fairsched")
@click.option("--debug", is_flag=True,
              help="Print the traceback of an error before its one-line message.")
@click.pass_context
def main(ctx, debug):
    """fairsched: a fair supervisor for specialised worker processes."""
    ctx.obj = {"debug": debug}


# Command modules attach their commands to `main` on import (one import line each, below).
from fairsched.cli import (  # noqa: E402,F401
    queue_cmds,
    sched_cmds,
    supervisor_cmds,
)
