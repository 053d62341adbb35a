"""`dlab`, the console script: every command of cluster/cli/main.py plus the chaos
harness's (`dlab chaos ...`, `dlab report`, `dlab bench pipeline`, ...).

It lives in the top layer because it is the one module that imports every
area's commands; cluster/cli/main.py holds the parser and error handling it uses.
Run it without installing as `python -m chaos.cli`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from chaos.bench import pipeline as bench
from chaos.bench import sim as sim_bench
from chaos.commands import report as commands
from chaos.commands import run as run_commands
from cluster.cli import main as cli

REGISTER = (*cli.REGISTER, commands.register, run_commands.register, bench.register,
            sim_bench.register)


def build_parser() -> argparse.ArgumentParser:
    return cli.build_parser(REGISTER)


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(argv, REGISTER)


if __name__ == "__main__":
    sys.exit(main())
