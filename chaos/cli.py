"""`dlab`, the console script: every command of cluster/cli/main.py plus the chaos
harness's (`dlab chaos ...`, `dlab report`, `dlab bench pipeline`, ...).

It lives in the top layer because it is the one module that imports every
area's commands; cluster/cli/main.py holds the parser and error handling it uses.
Run it without installing as `python -m chaos.cli`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cluster.cli import main as cli
from cluster.cli.main import Area

# Loaded only when the command line needs them (cluster.cli.main.Area).
REGISTER = (*cli.REGISTER,
            Area("chaos.commands.report", commands=("report",)),
            Area("chaos.commands.run", commands=("chaos",)),
            Area("chaos.bench.pipeline", benchmarks=("pipeline",)),
            Area("chaos.bench.sim", benchmarks=("sim", "sweep")))


def build_parser() -> argparse.ArgumentParser:
    return cli.build_parser(REGISTER)


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(argv, REGISTER)


if __name__ == "__main__":
    sys.exit(main())
