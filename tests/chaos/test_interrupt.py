"""Ctrl-C ends a matrix even when a run's own code swallowed the
KeyboardInterrupt (cluster/cli/interrupt.py): CI once saw a local matrix
run to its end, exit 0, after SIGINT."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from chaos.harness import scenarios
from chaos.harness.run_config import RunConfig
from chaos.matrix import sweep
from cluster.cli import interrupt


def test_sigint_marks_the_interrupt_and_the_old_handler_comes_back() -> None:
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), interrupt.watching():
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs at the next bytecode boundary
            pass
    assert interrupt.requested.is_set()
    assert signal.getsignal(signal.SIGINT) is before
    with interrupt.watching():  # a new command starts unmarked
        assert not interrupt.requested.is_set()


def test_a_swallowed_interrupt_ends_the_sequence_after_its_run(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    done: list[str] = []

    def run_one(cfg: RunConfig, images: Any = None) -> sweep.SweepRun:
        done.append(cfg.run_id)
        try:
            raise KeyboardInterrupt  # as SIGINT would, inside the run ...
        except BaseException:
            interrupt.requested.set()  # ... marked by the handler ...
        # ... and swallowed by the run's code, which goes on.
        return sweep.SweepRun(cfg.run_id, None, "x", "", False, 0.0)

    monkeypatch.setattr(sweep, "run_one", run_one)
    configs = [RunConfig(scenario=scenarios.get("clean-restart"), role="SYNC_MASTER",
                         flush="SYNC_FLUSH", seed=s, out_dir=str(tmp_path)) for s in (1, 2, 3)]
    with interrupt.watching(), pytest.raises(KeyboardInterrupt):
        sweep.run_in_order(configs)
    assert len(done) == 1
    interrupt.requested.clear()
