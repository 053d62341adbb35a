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
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cluster.backends.interface import BackendError
from cluster.cli import closed_pipe, interrupt
from store.config import ConfigError
from store.seams.lock import StoreLockedError
from store.store import StoreOpenError
from store.tools.cli_args import UserError

# `register(subparsers, bench_subparsers)` of an area.
Register = Callable[[Any, Any], None]


@dataclass(frozen=True)
class Area:
    """One area's commands: the module whose `register(subparsers,
    bench_subparsers)` adds them, and their names (top-level commands,
    benchmarks under `dlab bench`). A command line that names a command
    loads only the area that has it: a node process (`python -m cluster.cli
    node`, started at every node start of every run) or a `dlab cluster
    status` then imports no benchmark, backend or chaos module it does not
    use. tests/test_layers.py checks the names against what each module
    registers."""

    module: str
    commands: tuple[str, ...] = ()
    benchmarks: tuple[str, ...] = ()

    def __call__(self, sub: Any, bench_sub: Any) -> None:
        importlib.import_module(self.module).register(sub, bench_sub)


# The areas of this layer and below, in `--help` order.
REGISTER: tuple[Area, ...] = (
    Area("store.tools.cli", commands=("store",)),
    Area("store.tools.bench", benchmarks=("durable-mark", "group-commit", "recovery", "store")),
    Area("cluster.cli.commands", commands=("cluster", "consume", "controller", "node", "send")),
    Area("cluster.cli.image", commands=("image",)),
    Area("cluster.cli.bench", benchmarks=("catch-up", "sync-master")),
)


def areas_for(argv: Sequence[str], register: Sequence[Register]) -> list[Register]:
    """The areas a command line needs: the one that has the command it
    names (`dlab bench NAME`: the benchmark's), else every area (`--help`,
    an unknown command: the full list of choices)."""
    areas = [a for a in register if isinstance(a, Area)]
    if len(areas) < len(register) or not argv or argv[0].startswith("-"):
        return list(register)
    if argv[0] == "bench":
        if len(argv) < 2 or argv[1].startswith("-"):
            return list(register)
        found: list[Register] = [a for a in areas if argv[1] in a.benchmarks]
    else:
        found = [a for a in areas if argv[0] in a.commands]
    return found if len(found) == 1 else list(register)


def build_parser(register: Sequence[Register] = REGISTER,
                 argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The `dlab` parser with every area's commands, or (`argv` given) only
    those the command line needs (areas_for)."""
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
    for area in (register if argv is None else areas_for(argv, register)):
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
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(register, argv)
    args = parser.parse_args(argv)  # --help writes to stdout (and exits) here
    handler: Callable[[argparse.Namespace], int | None] = args.handler
    try:
        with interrupt.watching():
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
