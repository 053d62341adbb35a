"""The command-line machinery, and the commands of the cluster layer and
below. Each area registers its own subcommands (store/tools/cli.py,
store/tools/bench.py, cluster/cli/commands.py, ...), so this module only wires
them together and turns expected errors into one clear line and exit code 2
instead of a traceback.

`dlab` (the console script) is chaos/cli.py: these commands plus the chaos
harness's, which this layer may not import. `python -m cluster.cli`, how
backends start nodes, runs the commands here (no chaos modules loaded)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from cluster.backends.interface import BackendError
from cluster.cli import bench, closed_pipe, commands, image
from store.config import ConfigError
from store.seams.lock import StoreLockedError
from store.store import StoreOpenError
from store.tools import bench as store_bench
from store.tools import cli as store_cli
from store.tools.cli_args import UserError

# `register(subparsers, bench_subparsers)` of each area, in `--help` order.
Register = Callable[[Any, Any], None]
REGISTER: tuple[Register, ...] = (
    store_cli.register,
    store_bench.register,
    commands.register,
    image.register,
    bench.register,
)


def build_parser(register: Sequence[Register] = REGISTER) -> argparse.ArgumentParser:
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
    for area in register:
        area(sub, bench_sub)
    return parser


def main(argv: Sequence[str] | None = None, register: Sequence[Register] = REGISTER) -> int:
    try:
        try:
            status = _run(argv, register)
        except SystemExit:  # argparse's --help and usage errors: flush them here too
            closed_pipe.flush_output()
            raise
        closed_pipe.flush_output()
    except BrokenPipeError:
        # The reader of our output stopped early (`... | head`): not an error
        # worth a traceback (cluster/cli/closed_pipe.py).
        if not closed_pipe.silence_closed_output():
            raise
        return closed_pipe.EXIT_CLOSED_PIPE
    return status


def _run(argv: Sequence[str] | None, register: Sequence[Register]) -> int:
    parser = build_parser(register)
    args = parser.parse_args(argv)  # --help writes to stdout (and exits) here
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
        if isinstance(exc, ConfigError | StoreLockedError | StoreOpenError | BackendError):
            print(f"dlab: error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
