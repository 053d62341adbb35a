"""`dlab`: the one command-line entry. Each area registers its own
subcommands (store/cli.py, store/bench.py, cluster/commands.py, ...), so this
module only wires them together and turns expected errors into one clear
line and exit code 2 instead of a traceback."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

# Modules that define `register(subparsers, bench_subparsers)`; a module that
# is not there yet (an area still being built) is skipped.
COMMAND_MODULES = [
    "store.cli",
    "store.bench",
    "cluster.commands",
    "cluster.image",
    "ha.bench",
    "chaos.commands",
    "chaos.run_commands",
    "chaos.bench",
]


class UserError(Exception):
    """An error caused by input; printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dlab",
        description=(
            "durability-lab: run RocketMQ-style master-slave commit logs, break them, "
            "and measure what each replication and flush mode really keeps."
        ),
        epilog="Run `dlab COMMAND --help` for the options of each command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    bench = sub.add_parser(
        "bench",
        help="benchmarks; each prints a table and, last, one JSON line with its ratio",
        description="Benchmarks. Each measures a baseline in the same run and prints the "
        "figure as a ratio to it (this machine is shared; absolute times mean little).",
    )
    bench_sub = bench.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(sub, bench_sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int | None] = args.handler
    try:
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except UserError as exc:
        print(f"dlab: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # expected domain errors carry a message for users
        from cluster.backend import BackendError
        from store.config import ConfigError
        from store.lock import StoreLockedError
        from store.store import StoreOpenError

        if isinstance(exc, ConfigError | StoreLockedError | StoreOpenError | BackendError):
            print(f"dlab: error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    # `python -m cluster.cli` (how backends start nodes) runs this file as
    # __main__: call the imported module's main so the UserError that command
    # modules raise (cluster.cli.UserError) is the class main catches.
    from cluster.cli import main as _main

    sys.exit(_main())
