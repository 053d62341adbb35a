"""Which runs keep their nodes' stores (`--keep-stores`), decided from what
each run found.

A run's stores (RUN/cluster/) are evidence a later `dlab report` reads again
(chaos/check/kept_stores.py), but most of a matrix's runs find nothing and a
sweep of them filled a disk with segments. Once a run has written its
result directory, its own outcome (chaos/check/summary.py run_outcome, from
its read-back) decides:

- `all`: every run keeps its stores (as runs always did);
- `none`: no run does; each is judged from its read-back (records.jsonl,
  final.json) only;
- `findings` (the commands' default): a run keeps them when it found
  something — an acknowledged message lost (on the master, everywhere,
  stranded on a rejected slave, or delivered then lost), a promise
  violation, a slave ahead of the master, byte divergence between master and
  slave on their common range, damage left in a store, a node that refused
  to start, or an outcome that could not be judged — and, of the others, a
  seeded sample of 1 in SAMPLE_ONE_IN, drawn from the run's seed and cell so
  the same run decides the same way every time.

What it decided is added to params.json: `keep_stores` (the setting),
`stores_kept` and `stores_kept_why` (README, "Kept stores"). A kept store's
segments are rewritten with holes past their data (chaos/harness/sparse.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from chaos.check.kept_stores import first_difference
from chaos.check.run_dirs import RunInfo, load_run
from chaos.check.summary import RunOutcome, run_outcome
from chaos.harness import sparse
from chaos.harness.plan import stream
from chaos.harness.run_config import KeepStores
from chaos.schema import SchemaError, load_json_file, read_jsonl, write_json

# Of the runs that found nothing, 1 in this many keeps its stores (a sample
# to check the read-back against).
SAMPLE_ONE_IN = 10


@dataclass(frozen=True)
class KeepDecision:
    keep: KeepStores
    kept: bool
    why: str
    # The run's outcome the decision was judged from (with `findings`), for
    # a caller that would otherwise judge the same files again.
    outcome: RunOutcome | None = field(default=None, compare=False, repr=False)

    def params(self) -> dict[str, Any]:
        """The fields params.json records."""
        return {"keep_stores": str(self.keep), "stores_kept": self.kept,
                "stores_kept_why": self.why}


def sampled(seed: int, run_id: str) -> bool:
    """Whether a run without findings is in the kept sample: from its seed
    and its id (the cell), so the cells of one seed are drawn apart."""
    return stream(seed, f"keep-stores:{run_id}").randrange(SAMPLE_ONE_IN) == 0


def divergence(master: Sequence[dict[str, Any]], slave: Sequence[dict[str, Any]]
               ) -> int | None:
    """The first offset where the two logs' records differ on the range
    both hold (None: they agree there)."""
    if not master or not slave:
        return None
    lo = max(master[0]["offset"], slave[0]["offset"])
    hi = min(master[-1]["offset"] + master[-1]["size"], slave[-1]["offset"] + slave[-1]["size"])

    def common(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in rows if r["offset"] >= lo and r["offset"] + r["size"] <= hi]

    return first_difference(common(master), common(slave))


def findings(o: RunOutcome, run: RunInfo) -> list[str]:
    """What the run found, one phrase each (empty: nothing)."""
    found = [f"{n:,} {what}" for n, what in (
        (o.acked_lost_master, "acknowledged lost on the master"),
        (o.acked_lost_everywhere, "acknowledged lost everywhere"),
        (o.acked_stranded, "acknowledged stranded"),
        (o.promise_violations, "promise violations"),
        (o.slave_ahead_bytes, "bytes of a slave ahead"),
        (int((o.consumer or {}).get("delivered_then_lost") or 0), "delivered then lost"),
    ) if n]
    found += [f"{f['node']} refused to start" for f in run.faults if f["kind"] == "refused"]
    found += [f"{n.name}'s store damaged at {n.final['first_bad_offset']:,}"
              for n in run.nodes if n.final.get("first_bad_offset") is not None]
    master = read_jsonl(run.nodes[0].records_path)
    for s in run.nodes[1:]:
        at = divergence(master, read_jsonl(s.records_path))
        if at is not None:
            found.append(f"{s.name} diverges from the master at {at:,}")
    return found


def decide(keep: KeepStores, found: Sequence[str], in_sample: bool) -> tuple[bool, str]:
    """Pure: whether the run keeps its stores, and why, in words."""
    if keep is KeepStores.ALL:
        return True, "--keep-stores all"
    if keep is KeepStores.NONE:
        return False, "--keep-stores none: judged from the read-back only"
    if found:
        return True, "found: " + "; ".join(found)
    if in_sample:
        return True, f"nothing found; kept as the seeded sample of 1 in {SAMPLE_ONE_IN}"
    return False, f"nothing found (not in the seeded sample of 1 in {SAMPLE_ONE_IN}): " \
                  "judged from the read-back only"


def _judge(run_dir: str) -> tuple[list[str], RunOutcome | None]:
    try:
        outcome = run_outcome(run_dir)
        return findings(outcome, load_run(run_dir, 0)), outcome
    except (SchemaError, ValueError, KeyError, OSError) as exc:
        # Nothing to judge it by but the stores: they are kept.
        return [f"its outcome could not be judged ({exc})"], None


def apply(run_dir: str, keep: KeepStores) -> KeepDecision:
    """Decide for the finished run at `run_dir`, record it in params.json,
    then drop its stores or write the kept ones' segments sparse. The
    decision is written before a store is dropped, and a store that cannot
    be rewritten sparse is left as it is (it reads the same either way)."""
    cluster = os.path.join(run_dir, "cluster")
    path = os.path.join(run_dir, "params.json")
    params = load_json_file(path)
    if not os.path.isdir(cluster):
        decision = KeepDecision(keep, False, "the run left no stores")
    else:
        found, outcome = _judge(run_dir) if keep is KeepStores.FINDINGS else ([], None)
        in_sample = sampled(int(params["seed"]), str(params["run_id"]))
        decision = KeepDecision(keep, *decide(keep, found, in_sample), outcome=outcome)
    write_json(path, {**params, **decision.params()})
    if decision.kept:
        nodes = os.path.join(cluster, "nodes")
        for name in sorted(os.listdir(nodes)) if os.path.isdir(nodes) else []:
            with contextlib.suppress(OSError):
                sparse.sparsify_store(os.path.join(nodes, name, "data"))
    elif os.path.isdir(cluster):
        shutil.rmtree(cluster, ignore_errors=True)
    return decision
