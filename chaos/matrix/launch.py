"""Starting runs from a command: the run of a RunConfig on its backend, and
the results directory a command was given, checked before anything starts.
Shared by `dlab chaos run|matrix|replay|compare-backends`."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from chaos.check import keep_decision
from chaos.harness import scenarios
from chaos.harness.run_base import ChaosRun
from chaos.harness.run_config import KEEP_STORES, Backend, KeepStores, RunConfig
from cluster.cli.controller_settings import ack_settings, add_ack_options, add_elect_unclean
from ha.config import HAMode
from store.tools.cli_args import UserError

if TYPE_CHECKING:
    from chaos.check.summary import RunOutcome
    from cluster.backends.image import CheckedImages


def scenario_list(text: str) -> list[str]:
    """--scenarios: comma-separated names, each a shipped scenario."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in scenarios.SCENARIOS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown scenario(s) {', '.join(unknown)}; see `dlab chaos scenarios`")
    return names


def keep_stores_option(p: argparse.ArgumentParser) -> None:
    """--keep-stores, on every command that starts runs for a report
    (chaos/check/keep_decision.py decides per run)."""
    p.add_argument("--keep-stores", choices=KEEP_STORES, default="findings",
                   help="which runs keep their nodes' stores once read back: findings "
                   "(default: a run that lost an acknowledged message, broke a promise, left "
                   "a slave ahead or diverging, damage, or a node refusing to start, and a "
                   "seeded 1 in 10 of the others), all, or none (the read-back only); "
                   "params.json says what each run kept and why")


HA_MODES = ("classic", "controller")


def controller_options(p: argparse.ArgumentParser, *, ha_modes: bool) -> None:
    """--ha-mode (and with `ha_modes`, a matrix's --ha-modes) and
    controller mode's ack settings, RocketMQ's defaults, on every command
    that starts runs; controller_fields reads them back."""
    c = p.add_argument_group("controller mode (RocketMQ 5's automatic failover; every "
                             "backend)")
    c.add_argument("--ha-mode", choices=HA_MODES, default="classic",
                   help="classic (default): the role is fixed, failover is by hand (the "
                   "scenarios' promote); controller: a controller elects the master from the "
                   "SyncStateSet, and the scenarios' promote waits for its election")
    if ha_modes:
        c.add_argument("--ha-modes", type=ha_mode_list, default=None,
                       help="comma-separated: classic (the roles) and/or controller (one "
                       "mode, whose role its ack settings make); default: --ha-mode")
    add_ack_options(c)
    add_elect_unclean(c)


def ha_mode_list(text: str) -> list[str]:
    """--ha-modes: comma-separated, each classic or controller."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in HA_MODES]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown HA mode {', '.join(bad) or repr(text)}; choose from {', '.join(HA_MODES)}")
    return names


def controller_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The RunConfig fields of the options controller_options adds."""
    return {"ha_mode": HAMode(args.ha_mode),
            **ack_settings(args), "elect_unclean": args.elect_unclean}


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
    run: ChaosRun
    if cfg.backend is Backend.SIM:
        from chaos.sim.run import SimRun

        run = SimRun(cfg, log=log or (lambda s: None))
    else:
        from chaos.harness.connect import backend_factory, sender_factory, status_of
        from chaos.harness.runner import Run

        run = Run(cfg, backend_factory=backend_factory(images), sender_factory=sender_factory,
                  status=status_of, log=log or (lambda s: None))
    return KeepingStores(run, cfg.keep_stores)


class KeepingStores:
    """A run that, once finished, keeps its stores or drops them as
    --keep-stores says (chaos/check/keep_decision.py). A run that fails
    decides nothing: whatever it left stays."""

    def __init__(self, run: ChaosRun, keep: KeepStores) -> None:
        self.run = run
        self.keep = keep
        # The outcome the decision judged (with `findings`; None otherwise):
        # a sweep reports it instead of judging the same files again.
        self.outcome: RunOutcome | None = None

    @property
    def run_dir(self) -> str:
        return self.run.run_dir

    def __getattr__(self, name: str) -> Any:
        """Everything else is the run's (its cluster_dir, its config...)."""
        return getattr(self.run, name)

    def execute(self) -> str:
        run_dir = self.run.execute()
        self.outcome = keep_decision.apply(run_dir, self.keep).outcome
        return run_dir
