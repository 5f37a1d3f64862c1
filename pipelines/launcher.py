"""The `lazyhippo` command: a `query` goes to the home's warm query daemon when one answers
(`lazyhippo_dagster.query_daemon`), before the CLI and what it imports are loaded; anything else, and a query no
daemon answered, to the CLI, where a query run in its own process starts the daemon for the next one."""

import sys

from lazyhippo_dagster.query_daemon import forward


def main() -> None:
    args = sys.argv[1:]
    is_query = args[:1] == ["query"] and "--help" not in args
    if is_query:
        reply = forward(args[1:])
        if reply is not None:
            sys.stdout.write(reply["stdout"])
            sys.stdout.flush()
            sys.stderr.write(reply["stderr"])
            sys.exit(reply["exit_code"])
    from lazyhippo_dagster import cli

    cli.START_DAEMON = is_query
    cli.app()


if __name__ == "__main__":
    main()
