"""The `fairsched` command line: a click group; each command module registers itself."""

import logging
import sys
from typing import NoReturn

import click

from fairsched import __version__


class Commands(click.Group):
    """click's group, but a usage error is one line (the contract's, exit 2) like every other."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # plain `fairsched`: the help
            exc.show()
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
            message = f"{exc.format_message().rstrip('.')}{hint}"
            if isinstance(exc, click.NoSuchOption) and exc.ctx is not None \
                    and exc.ctx.command is self:
                message = self._misplaced(exc.ctx.command_path, exc.option_name,
                                          sys.argv[1:] if args is None else args) or message
            click.echo(f"fairsched: {message}", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("", err=True)
            sys.exit(130)  # Ctrl-C at a prompt
        sys.exit(code if isinstance(code, int) else 0)

    def _misplaced(self, path: str, option: str, args: list[str]) -> str | None:
        """For an option of a command given before the command's name (`fairsched --config
        w.toml ps`): where it goes."""
        taking = [name for name, command in self.commands.items()
                  if any(option in p.opts for p in command.params)]
        named = next((a for a in args if a in self.commands), None)
        if not taking or (named is not None and named not in taking):
            return None
        command = f"{path} {named or 'COMMAND'}"
        return (f"{option} goes after the command's name, as in `{command} {option} ...` (see "
                f"`{command} --help`)")

    def invoke(self, ctx):
        # Ahead of click, which would answer Ctrl-C with a blank line and nothing else.
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            interrupted()


def interrupted(what: str = "") -> NoReturn:
    """Ctrl-C: one line, exit 130 (128 + SIGINT, as a shell reports it)."""
    # On a terminal the line starts below the "^C" it echoed.
    start = "\n" if sys.stderr.isatty() else ""
    click.echo(f"{start}fairsched: interrupted{what}", err=True)
    sys.exit(130)


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fairsched")
@click.option("--debug", is_flag=True,
              help="Print the traceback of an error before its one-line message.")
@click.pass_context
def main(ctx, debug):
    """fairsched: a fair supervisor for specialised worker processes."""
    ctx.obj = {"debug": debug}
    if not debug:
        # psycopg's warnings (one as Ctrl-C ends a query the server never answered) would
        # reach standard error through logging's last resort, beside the command's one line.
        # `supervise` has a log of its own: they still go there.
        logging.getLogger("psycopg").addHandler(logging.NullHandler())


# Command modules attach their commands to `main` on import (one import line each, below).
from fairsched.cli import (  # noqa: E402,F401
    queue_cmds,
    sched_cmds,
    schedule_cmds,
    supervisor_cmds,
)
