"""Starting runs from a command: the run of a RunConfig on its backend, and
the results directory a command was given, checked before anything starts.
Shared by `dlab chaos run|matrix|replay|compare-backends`."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from chaos.harness import scenarios
from chaos.harness.run_base import ChaosRun
from chaos.harness.run_config import Backend, RunConfig
from store.tools.cli_args import UserError

if TYPE_CHECKING:
    from cluster.backends.image import CheckedImages


def scenario_list(text: str) -> list[str]:
    """--scenarios: comma-separated names, each a shipped scenario."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in scenarios.SCENARIOS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown scenario(s) {', '.join(unknown)}; see `dlab chaos scenarios`")
    return names


def results_dir(path: str, option: str = "--out") -> None:
    """--out: a directory, made if missing; refused clearly before any run
    starts (a cluster would otherwise be started and torn down for nothing)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"{option} {path} is a file, not a directory: give a directory for the "
                        "results (it is created if missing)")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{option} {path}: cannot create it ({exc.strerror or exc}); give a "
                        "directory this user can write") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{option} {path} is not writable by this user; give another directory")


def make_run(cfg: RunConfig, log: Callable[[str], None] | None = None, *,
             images: CheckedImages | None = None) -> ChaosRun:
    """A run of `cfg` on its backend (chaos/harness/runner.py's Run on local
    processes or compose containers, chaos/sim/run.py's SimRun on the sim).
    `images`: the node images the command has already brought up to date
    (compose; shared by the runs of one command)."""
    if cfg.backend is Backend.SIM:
        from chaos.sim.run import SimRun

        return SimRun(cfg, log=log or (lambda s: None))
    from chaos.harness.connect import backend_factory, sender_factory, status_of
    from chaos.harness.runner import Run

    return Run(cfg, backend_factory=backend_factory(images), sender_factory=sender_factory,
               status=status_of, log=log or (lambda s: None))
