"""The known-bug corpus (chaos/bugs.py): each `--emulate BUG` switch brings
its RocketMQ defect back where the real fix removed it, and the checker
catches it in its scenario.

The chaos tests run each bug's scenario on real local clusters, 2 seeds with
the switch and the same 2 without, and judge the runs with chaos.bugs.judge_run
(the report's promise rules, chaos.promises.judge, and the consume checker,
without Spark). The 5 + 5 seed figures are in docs/known-bugs.md (`dlab chaos
bugs --check --runs 5`). The unit tests pin each switch point on its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from chaos import bugs
from chaos.run_commands import make_run
from chaos.runner import RunConfig
from ha.config import TESTING as HA_TESTING
from ha.config import SlaveAheadPolicy
from ha.session import Accept, Close, MasterSession
from store.config import TESTING, ConfigError, FlushMode
from store.emulate import RMQ_3349, RMQ_8239, SWITCHES
from store.failpoints import Failpoints
from store.record import Message
from store.store import MessageStore

SEEDS = (1, 2)


def _run(fields: dict[str, Any]) -> str:
    return make_run(RunConfig(**fields).validate()).execute()


@pytest.mark.parametrize("bug_id", [b.id for b in bugs.CORPUS])
def test_the_checker_catches_each_bug_with_its_switch_and_never_without(
        tmp_path: str, bug_id: str) -> None:
    bug = bugs.get(bug_id)
    check = bugs.check_bug(bug, SEEDS, str(tmp_path), _run)
    detail = [(r.emulated, r.seed, r.error or r.figures) for r in check.runs]
    assert check.failed_runs == 0, detail
    assert check.caught == check.with_switch == len(SEEDS), detail
    assert check.false_positives == 0 and check.without_switch == len(SEEDS), detail
    # The switch is recorded with the run, and only with its side.
    for r in check.runs:
        assert r.run_dir is not None
        with open(os.path.join(r.run_dir, "params.json")) as f:
            assert json.load(f)["emulate"] == ([bug_id] if r.emulated else [])


# ------------------------------------------------------------- switch points
def test_rmq_8239_lets_consumers_read_what_is_not_flushed(tmp_path: str) -> None:
    """Under SYNC_FLUSH with a stalled flusher, the fixed store lets
    consumers read only up to `flushed`; with the switch, up to `wrote`."""

    async def readable(emulate: frozenset[str], path: str) -> tuple[int, int]:
        cfg = TESTING.with_(flush_mode=FlushMode.SYNC_FLUSH, emulate=emulate)
        store = MessageStore.open(path, cfg,
                                  failpoints=Failpoints("flush_before_write=delay:1000@1"))
        await store.start()
        put = asyncio.ensure_future(store.put(Message("t", b"x" * 100, {"UNIQ_KEY": "a"})))
        await asyncio.sleep(0.3)  # the flush of that put is stalled
        count = store.queue_offsets("t", 0)[1]
        wrote_then = store.log.wrote
        await put
        await store.close()
        return count, wrote_then

    fixed, wrote = asyncio.run(readable(frozenset(), os.path.join(tmp_path, "a")))
    assert wrote > 0 and fixed == 0
    buggy, _ = asyncio.run(readable(frozenset({RMQ_8239}), os.path.join(tmp_path, "b")))
    assert buggy == 1


@pytest.mark.parametrize("policy", list(SlaveAheadPolicy))
def test_rmq_3349_believes_a_first_report_beyond_the_master_whatever_the_policy(
        policy: SlaveAheadPolicy) -> None:
    cfg = HA_TESTING.with_(slave_ahead_policy=policy)
    fixed = MasterSession("s", cfg, now=0).on_report(5000, master_wrote=1000, master_min=0,
                                                      now=0)
    if policy is SlaveAheadPolicy.TRUST:
        assert fixed == Accept(5000)
    else:
        assert not isinstance(fixed, Accept)
    session = MasterSession("s", cfg.with_(emulate=frozenset({RMQ_3349})), now=0)
    assert session.on_report(5000, master_wrote=1000, master_min=0, now=0) == Accept(5000)
    # Only the first report: later ones keep the #3016 check (beyond shipped: closed).
    assert isinstance(session.on_report(9000, master_wrote=1000, master_min=0, now=0), Close)


def test_every_corpus_entry_has_a_switch_and_unknown_ids_are_refused() -> None:
    assert {b.id for b in bugs.CORPUS} <= set(SWITCHES)
    with pytest.raises(ConfigError, match="unknown bug"):
        TESTING.with_(emulate=frozenset({"rmq-1"}))
    out = subprocess.run([sys.executable, "-m", "chaos.cli", "chaos", "bugs", "--json"],
                         capture_output=True, text=True, check=True).stdout
    assert [b["id"] for b in json.loads(out)] == [b.id for b in bugs.CORPUS]
    bad = subprocess.run([sys.executable, "-m", "chaos.cli", "chaos", "run", "--scenario",
                          "fsync-eio", "--role", "SYNC_MASTER", "--flush", "SYNC_FLUSH",
                          "--out", "/nonexistent-never-used", "--emulate", "rmq-1"],
                         capture_output=True, text=True)
    assert bad.returncode == 2
    assert "unknown bug 'rmq-1'" in bad.stderr and "rmq-2706" in bad.stderr
