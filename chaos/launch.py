"""Starting runs from a command: the run of a RunConfig on its backend, and
the results directory a command was given, checked before anything starts.
Shared by `dlab chaos run|matrix|replay|compare-backends`."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from chaos import scenarios
from chaos.run_base import ChaosRun
from chaos.run_config import Backend, RunConfig
from store.cli_args import UserError


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


def make_run(cfg: RunConfig, log: Callable[[str], None] | None = None) -> ChaosRun:
    """A run of `cfg` on its backend (chaos/runner.py's Run on local
    processes or compose containers, chaos/sim.py's SimRun on the sim)."""
    if cfg.backend is Backend.SIM:
        from chaos.sim import SimRun

        return SimRun(cfg, log=log or (lambda s: None))
    from chaos.connect import backend_factory, sender_factory, status_of
    from chaos.runner import Run

    return Run(cfg, backend_factory=backend_factory, sender_factory=sender_factory,
               status=status_of, log=log or (lambda s: None))
