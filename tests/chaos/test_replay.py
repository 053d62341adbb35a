"""`dlab chaos replay RUN_DIR`: a run again from its recorded seed and
parameters. A sim run replayed on sim is the same directory byte for byte;
`--backend local` runs its fault schedule on real processes; what is not a
replayable run is refused with exit 2 and says why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from chaos.commands.replay import tree_hashes
from chaos.schema import load_json_file


def dlab(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chaos.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def _sim_run(out: Path, *extra: str) -> str:
    r = dlab("chaos", "run", "--backend", "sim", "--sim-duration", "8", "--scenario",
             "master-crash", "--role", "ASYNC_MASTER", "--flush", "ASYNC_FLUSH", "--seed", "3",
             "--producers", "3", "--rate", "40", "--out", str(out), *extra)
    assert r.returncode in (0, 1), r.stderr
    (run_id,) = os.listdir(out)
    return str(out / run_id)


def test_a_sim_run_replayed_on_sim_is_byte_identical(tmp_path: Path) -> None:
    original = _sim_run(tmp_path / "a")
    r = dlab("chaos", "replay", original, "--out", str(tmp_path / "b"))
    assert r.returncode in (0, 1), r.stderr
    assert "identical to the original, byte for byte" in r.stdout, r.stdout
    replayed = tmp_path / "b" / os.path.basename(original)
    a, b = tree_hashes(original), tree_hashes(str(replayed))
    assert a == b and len(a) > 10
    # The options that are not defaults came from params.json, not the command line.
    config = load_json_file(str(replayed / "params.json"))["config"]
    assert (config["workload"]["producers"], config["workload"]["rate_per_s"]) == (3, 40.0)
    assert config["sim_duration_s"] == 8.0


def test_a_replay_that_differs_says_which_files_and_exits_1(tmp_path: Path) -> None:
    original = _sim_run(tmp_path / "a")
    with open(os.path.join(original, "history.jsonl"), "a", encoding="utf-8") as f:
        f.write("\n")  # the original changed after it was written
    r = dlab("chaos", "replay", original, "--out", str(tmp_path / "b"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "NOT identical to the original: 1 file(s) differ: history.jsonl" in r.stdout


def test_a_sim_run_replayed_on_local_runs_its_fault_schedule(tmp_path: Path) -> None:
    original = _sim_run(tmp_path / "a")
    r = dlab("chaos", "replay", original, "--backend", "local", "--out", str(tmp_path / "b"),
             timeout=180)
    assert r.returncode in (0, 1), r.stdout[-2000:] + r.stderr[-2000:]
    (name,) = os.listdir(tmp_path / "b")
    assert name == os.path.basename(original).replace("-sim-s3", "-s3")  # a local run's id
    replayed = str(tmp_path / "b" / name)
    before = load_json_file(os.path.join(original, "params.json"))
    after = load_json_file(os.path.join(replayed, "params.json"))
    assert (before["backend"], after["backend"]) == ("sim", "local")
    for key in ("scenario", "role", "flush", "seed", "plan", "failpoints"):
        assert after[key] == before[key], key
    with open(os.path.join(replayed, "faults.jsonl"), encoding="utf-8") as f:
        kinds = [(row["kind"], row["node"]) for row in map(json.loads, f)]
    assert kinds == [("kill", "master"), ("start", "master")]
    assert "original:" in r.stdout and "identical" not in r.stdout


def test_what_is_not_a_replayable_run_is_refused_with_exit_2(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "params.json").write_text("{not json")
    old = tmp_path / "old"
    old.mkdir()
    (old / "params.json").write_text(json.dumps(
        {"scenario": "master-crash", "role": "SYNC_MASTER", "flush": "SYNC_FLUSH", "seed": 2}))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "params.json").write_text(json.dumps({"config": {"scenario": "master-crash"}}))
    gone = tmp_path / "gone"
    gone.mkdir()
    (gone / "params.json").write_text(json.dumps({"config": {"scenario": "no-such"}}))
    out = str(tmp_path / "out")
    cases = {str(tmp_path / "missing"): "is not a directory",
             str(empty): "is not a run directory (no params.json)",
             str(corrupt): "cannot be read as JSON",
             str(old): "its scenario and seed can be run again with `dlab "
                       "chaos run --scenario master-crash --role SYNC_MASTER --flush SYNC_FLUSH "
                       "--seed 2",
             str(broken): "`config` lacks 'workload'",
             str(gone): "unknown scenario 'no-such'"}
    for run_dir, message in cases.items():
        r = dlab("chaos", "replay", run_dir, "--out", out, timeout=60)
        assert r.returncode == 2, (run_dir, r.stdout, r.stderr)
        assert message in r.stderr and "Traceback" not in r.stderr, (run_dir, r.stderr)
    assert not os.path.exists(out)  # refused before anything was made


def test_a_replay_over_the_run_itself_is_refused(tmp_path: Path) -> None:
    original = _sim_run(tmp_path / "a")
    before = tree_hashes(original)
    r = dlab("chaos", "replay", original, "--out", str(tmp_path / "a"))
    assert r.returncode == 2 and "over the run itself" in r.stderr, r.stderr
    assert tree_hashes(original) == before
