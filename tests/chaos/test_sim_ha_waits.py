"""The HA loops' waits on a sim run (ha/wake.py): the master's ship loop and
the slave's report loop turn thousands of times a run, and no turn enters
an asyncio.timeout (its context, timer and task cancellation were a tenth
of a run: docs/performance-notes.md, "The simulated cluster")."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from pathlib import Path

import pytest

from chaos.harness import scenarios
from chaos.harness.runner import RunConfig
from chaos.sim.run import SimRun


def test_the_ha_loops_take_no_asyncio_timeout_per_turn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sim run's ship and report loops turn thousands of times; none of
    those turns enters an asyncio.timeout (other waits still may)."""
    callers: Counter[str] = Counter()
    real = asyncio.timeout

    def counting(delay: float | None) -> asyncio.Timeout:
        callers[sys._getframe(1).f_code.co_name] += 1
        return real(delay)

    monkeypatch.setattr(asyncio, "timeout", counting)
    cfg = RunConfig(scenario=scenarios.get("master-crash"), role="SYNC_MASTER",
                    flush="SYNC_FLUSH", seed=3, out_dir=str(tmp_path), backend="sim",
                    sim_duration_s=6.0)
    SimRun(cfg).execute()
    assert callers, "the run entered no asyncio.timeout at all: the count proves nothing"
    assert callers["_ship_loop"] == 0 and callers["_report_loop"] == 0, callers
