"""`--keep-stores all|findings|none` (chaos/check/keep_decision.py) and kept
stores written sparse (chaos/harness/sparse.py).

Real sim runs through `dlab chaos run` (a subprocess, as a user runs it):
seed 3 of master-crash under ASYNC_MASTER + ASYNC_FLUSH loses acknowledged
messages from the master, seed 2 of clean-restart under SYNC_MASTER +
SYNC_FLUSH finds nothing and is not in the seeded sample; both are
deterministic (the sim is a function of its seed). Then `dlab report` over a
mix of runs that kept their stores and runs that did not."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from support.cli_helpers import dlab
from support.pipeline_fixtures import spark  # noqa: F401
from support.store_helpers import fill

from chaos import cli
from chaos.check.keep_decision import SAMPLE_ONE_IN, decide, divergence, sampled
from chaos.check.kept_stores import first_difference
from chaos.check.summary import run_outcome
from chaos.harness import scenarios, sparse
from chaos.harness.readback import read_back
from chaos.harness.run_config import KeepStores, RunConfig
from chaos.harness.workload import WorkloadConfig
from chaos.matrix.launch import make_run
from store.config import TESTING

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")

LOSS = ("master-crash", "ASYNC_MASTER", "ASYNC_FLUSH", 3)
CLEAN = ("clean-restart", "SYNC_MASTER", "SYNC_FLUSH", 2)
SIM_S = "10"


def _run_id(scenario: str, role: str, flush: str, seed: int) -> str:
    return RunConfig(scenario=scenarios.get(scenario), role=role, flush=flush,  # type: ignore[arg-type]
                     seed=seed, out_dir="", backend="sim").run_id  # type: ignore[arg-type]


def _sim_run(out: Path, cell: tuple[str, str, str, int], *extra: str) -> Path:
    """`dlab chaos run` on the sim; the run directory it wrote."""
    scenario, role, flush, seed = cell
    r = dlab("chaos", "run", "--backend", "sim", "--sim-duration", SIM_S, "--scenario",
             scenario, "--role", role, "--flush", flush, "--seed", str(seed), "--out",
             str(out), *extra)
    assert r.returncode in (0, 1), r.stderr
    assert "Traceback" not in r.stderr
    return out / _run_id(*cell)


def _params(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "params.json").read_text())


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def default_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The two cells run with the default setting (findings), into one runs dir."""
    out = tmp_path_factory.mktemp("runs")
    return out, _sim_run(out, LOSS), _sim_run(out, CLEAN)


def test_default_findings_keeps_the_run_that_lost_acks_and_drops_the_clean_one(
        default_runs: tuple[Path, Path, Path]) -> None:
    _, lossy, clean = default_runs
    assert run_outcome(str(lossy)).acked_lost_master > 0  # the run's own outcome
    p = _params(lossy)
    assert (p["keep_stores"], p["stores_kept"]) == ("findings", True)
    assert "acknowledged lost on the master" in p["stores_kept_why"]
    assert p["config"]["keep_stores"] == "findings"
    assert (lossy / "cluster" / "nodes" / "master" / "data" / "commitlog").is_dir()

    o = run_outcome(str(clean))
    assert (o.acked_lost_master, o.promise_violations, o.slave_ahead_bytes) == (0, 0, 0)
    assert not sampled(CLEAN[3], clean.name)
    p = _params(clean)
    assert (p["keep_stores"], p["stores_kept"]) == ("findings", False)
    assert "nothing found" in p["stores_kept_why"]
    assert not (clean / "cluster").exists()
    # The read-back stays: the run is still judged from it.
    for node in ("master", "slave1"):
        assert (clean / "nodes" / node / "records.jsonl").stat().st_size > 0


def test_keep_stores_all_and_none_override_what_the_run_found(tmp_path: Path) -> None:
    kept = _sim_run(tmp_path / "all", CLEAN, "--keep-stores", "all")
    assert (_params(kept)["stores_kept"], _params(kept)["stores_kept_why"]) == (
        True, "--keep-stores all")
    assert (kept / "cluster" / "nodes" / "slave1" / "data" / "commitlog").is_dir()
    dropped = _sim_run(tmp_path / "none", LOSS, "--keep-stores", "none")
    assert _params(dropped)["stores_kept"] is False
    assert not (dropped / "cluster").exists()
    assert run_outcome(str(dropped)).acked_lost_master > 0  # judged from the read-back


def test_the_same_seed_and_setting_give_a_byte_identical_run_directory(
        tmp_path: Path, default_runs: tuple[Path, Path, Path]) -> None:
    _, lossy, clean = default_runs
    again = tmp_path / "again"
    assert _hashes(_sim_run(again, LOSS)) == _hashes(lossy)
    assert _hashes(_sim_run(again, CLEAN)) == _hashes(clean)


def test_a_run_without_findings_in_the_seeded_sample_keeps_its_stores(tmp_path: Path) -> None:
    scenario, role, flush, _ = CLEAN
    seed = next(s for s in range(1, 200) if sampled(s, _run_id(scenario, role, flush, s)))
    run_dir = _sim_run(tmp_path, (scenario, role, flush, seed))
    assert run_outcome(str(run_dir)).acked_lost_master == 0
    p = _params(run_dir)
    assert p["stores_kept"] is True and "seeded sample" in p["stores_kept_why"]
    assert (run_dir / "cluster" / "nodes" / "master" / "data" / "commitlog").is_dir()


def test_the_sample_is_about_one_in_ten_and_the_decision_follows_the_setting() -> None:
    ids = [_run_id(s, r, f, seed) for s in scenarios.QUICK_MATRIX
           for r in ("SYNC_MASTER", "ASYNC_MASTER") for f in ("SYNC_FLUSH", "ASYNC_FLUSH")
           for seed in range(1, 51)]
    share = sum(sampled(int(i.rsplit("-s", 1)[1]), i) for i in ids) / len(ids)
    assert abs(share - 1 / SAMPLE_ONE_IN) < 0.04
    assert decide(KeepStores.FINDINGS, ["1 acknowledged lost on the master"], False)[0]
    assert not decide(KeepStores.FINDINGS, [], False)[0]
    assert decide(KeepStores.FINDINGS, [], True)[0]
    assert decide(KeepStores.ALL, [], False)[0]
    assert not decide(KeepStores.NONE, ["a finding"], True)[0]


def test_divergence_is_the_first_differing_record_on_the_common_range() -> None:
    def row(off: int, msg: str) -> dict[str, Any]:
        return {"offset": off, "size": 100, "msg_id": msg, "body_crc": 1,
                "store_timestamp_ms": 1}

    master = [row(0, "a"), row(100, "b"), row(200, "x")]
    assert divergence(master, [row(0, "a"), row(100, "b")]) is None  # behind, agrees
    assert divergence(master, [row(0, "a"), row(100, "b"), row(200, "c"), row(300, "d")]) == 200


def test_a_segment_written_sparse_holds_its_data_not_its_size(tmp_path: Path) -> None:
    size, data = 8 * 1024 * 1024, os.urandom(10_000)
    path = tmp_path / "seg"
    sparse.write_sparse(str(path), data + bytes(size - len(data)))
    assert path.stat().st_size == size
    assert path.stat().st_blocks * 512 < size // 10
    assert path.read_bytes() == data + bytes(size - len(data))


def test_a_real_store_s_preallocated_segments_are_rewritten_sparse(tmp_path: Path) -> None:
    """A store the node code wrote (segments preallocated, zeros written
    ahead of the data): rewritten in place, it reads back the same records
    and its segments hold blocks for their data only."""
    seg = 4 * 1024 * 1024
    data = tmp_path / "data"
    fill(data, 300, replace(TESTING, segment_size_bytes=seg), body_size=1000)
    segments = sorted((data / "commitlog").iterdir())
    before = read_back(str(data)).records
    held = sum(p.stat().st_blocks * 512 for p in segments)
    assert held >= seg // 2, "the store preallocates (else this test shows nothing)"
    assert sparse.sparsify_store(str(data)) > 0
    assert read_back(str(data)).records == before
    for p in segments:
        end = sparse.file_data_end(str(p))
        assert p.stat().st_size == seg
        assert p.stat().st_blocks * 512 <= end + 64 * 1024
    assert sum(p.stat().st_blocks * 512 for p in segments) < seg // 4
    assert sparse.sparsify_store(str(data)) == 0  # nothing left to free
    assert not list((data / "commitlog").glob("*.sparse"))


def test_a_local_run_keeps_its_nodes_segments_sparse(tmp_path: Path) -> None:
    """Real node processes preallocate their segments; the kept copies hold
    blocks for their data only, and read back as the run's read-back."""
    cfg = RunConfig(scenario=scenarios.get("clean-restart"), role="SYNC_MASTER",  # type: ignore[arg-type]
                    flush="ASYNC_FLUSH", seed=4, out_dir=str(tmp_path),  # type: ignore[arg-type]
                    keep_stores=KeepStores.ALL,
                    workload=WorkloadConfig(producers=2, body_min_bytes=256,
                                            body_max_bytes=1024))
    run_dir = Path(make_run(cfg).execute())
    assert _params(run_dir)["stores_kept"] is True
    for node in ("master", "slave1"):
        data = run_dir / "cluster" / "nodes" / node / "data"
        segments = sorted((data / "commitlog").iterdir())
        assert segments
        for seg in segments:
            assert seg.stat().st_size == cfg.segment_size_bytes
            assert seg.stat().st_blocks * 512 <= sparse.file_data_end(str(seg)) + 64 * 1024
        recorded = [json.loads(x) for x in
                    (run_dir / "nodes" / node / "records.jsonl").read_text().splitlines()]
        assert recorded and first_difference(recorded, read_back(str(data)).records) is None


def test_a_kept_sim_store_is_sparse(default_runs: tuple[Path, Path, Path]) -> None:
    _, lossy, _ = default_runs
    seg = lossy / "cluster" / "nodes" / "slave1" / "data" / "commitlog" / ("0" * 20)
    assert seg.stat().st_blocks * 512 < seg.stat().st_size // 4


def test_a_bad_keep_stores_value_is_refused_with_exit_2(tmp_path: Path) -> None:
    r = dlab("chaos", "run", "--backend", "sim", "--scenario", "clean-restart", "--role",
             "SYNC_MASTER", "--flush", "SYNC_FLUSH", "--out", str(tmp_path),
             "--keep-stores", "some")
    assert r.returncode == 2 and "--keep-stores" in r.stderr and "findings" in r.stderr
    assert "Traceback" not in r.stderr
    assert not list(tmp_path.iterdir())


def test_the_report_over_kept_and_dropped_stores_says_which_it_reread(
        spark: Any, tmp_path: Path, default_runs: tuple[Path, Path, Path],  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    """`dlab report` in this process, on the suite's Spark session (a
    subprocess would start a JVM of its own; tests/chaos/test_report_browser.py
    runs the command as a subprocess)."""
    runs, lossy, clean = default_runs
    out = tmp_path / "report"
    status = cli.main(["report", str(runs), "--out", str(out)])
    err = capsys.readouterr().err
    assert status in (0, 1), err
    assert "Traceback" not in err
    verdicts = pd.read_csv(out / "verdicts.csv").set_index("run_id")
    assert verdicts.loc[lossy.name, "judged_from"] == "kept stores"
    assert verdicts.loc[clean.name, "judged_from"] == "read-back"
    assert "acknowledged lost" in verdicts.loc[lossy.name, "stores_kept_why"]
    assert "nothing found" in verdicts.loc[clean.name, "stores_kept_why"]
    assert verdicts.loc[lossy.name, "acked_lost_master"] > 0
    md = (out / "report.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("Stores:"))
    assert f"judged from the stores they kept, read again: {lossy.name}" in line
    assert f"judged from their read-back only (stores not kept): {clean.name}" in line


def test_a_sweep_run_reports_the_outcome_its_keep_decision_judged(tmp_path: Path) -> None:
    """chaos/matrix/sweep.py's run_one takes the outcome the keep decision
    judged instead of judging the run's files a second time: the same
    figures as a judgement of the finished directory from scratch."""
    from chaos.matrix.sweep import judge, run_one

    scenario, role, flush, seed = LOSS
    cfg = RunConfig(scenario=scenarios.get(scenario), role=role, flush=flush,  # type: ignore[arg-type]
                    seed=seed, out_dir=str(tmp_path), backend="sim",  # type: ignore[arg-type]
                    sim_duration_s=float(SIM_S), keep_stores=KeepStores.FINDINGS)
    run = make_run(cfg)
    run_dir = run.execute()
    assert run.outcome is not None and run.outcome == run_outcome(run_dir)
    assert run.outcome.acked_lost_master > 0  # the seed's loss, judged once

    swept = run_one(replace(cfg, out_dir=str(tmp_path / "swept")))
    fresh = judge(swept.run_id, swept.run_dir, None, swept.wall_s)
    assert swept.run_dir is not None and swept.error is None
    assert replace(swept, cpu_s=fresh.cpu_s) == fresh
    assert swept.acked_lost_master == run.outcome.acked_lost_master
