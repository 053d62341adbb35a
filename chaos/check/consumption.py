"""The consume-side checker: what a run's consumer was handed, against what
the nodes hold after the run.

It verifies, per run that consumed (it has consumed.jsonl, committed.jsonl
and consumer.json, chaos/schema.py):
- `duplicates_delivered`: deliveries beyond the first of each message id —
  a consumer killed between offset commits, or a broker that crashed before
  persisting the commits it had, hands them out again (at-least-once);
- `stored_never_delivered`: message ids in the master's recovered store,
  within what it lets consumers read (up to its flushed position under
  SYNC_FLUSH, its written one otherwise), that no incarnation was handed
  by the end of the run. Counted only when the consumer drained (it ran
  after the load ended until the cluster had nothing more for it); null
  otherwise, as the figure would then mean nothing;
- `delivered_then_lost`: ids handed to the consumer that no node's
  recovered store holds: consumed before they were durable;
- `delivered`, `consumer_incarnations`, `offsets_committed`: context.

It does not check order (a pull consumer reads each queue in queue-offset
order by construction), what a handler did with a message, nor the
producer side (history): a producer's retry stored twice is a duplicate
delivery here too, and the durability checker reports it as stored twice.

Runs without consumer files have no consume figures (None), not zeros.
The files are small (one row per delivery), so this reads them in the
driver, outside the Spark query.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from chaos.check.run_dirs import NodeInfo, RunInfo
from chaos.schema import read_jsonl

# Columns this module adds to the verdicts and comparison tables, in order.
COLUMNS = ("delivered", "duplicates_delivered", "stored_never_delivered",
           "delivered_then_lost", "consumer_incarnations", "offsets_committed")


def figures(deliveries: Iterable[Mapping[str, Any]], *, consumable_master_ids: set[str],
            every_node_ids: set[str], drained: bool, incarnations: int,
            offsets_committed: int) -> dict[str, int | None]:
    """The checker itself: pure, over delivery rows and id sets."""
    delivered = 0
    seen: set[str] = set()
    for row in deliveries:
        delivered += 1
        seen.add(row["msg_id"])
    return {
        "delivered": delivered,
        "duplicates_delivered": delivered - len(seen),
        "stored_never_delivered": len(consumable_master_ids - seen) if drained else None,
        "delivered_then_lost": len(seen - every_node_ids),
        "consumer_incarnations": incarnations,
        "offsets_committed": offsets_committed,
    }


def _ids(node: NodeInfo, *, up_to: int | None = None) -> set[str]:
    """Message ids of a node's recovered records (those ending at or before
    `up_to`, when given)."""
    out: set[str] = set()
    with open(node.records_path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            if r["msg_id"] is not None and (up_to is None or r["offset"] + r["size"] <= up_to):
                out.add(r["msg_id"])
    return out


def consumable_end(run: RunInfo) -> int:
    """Where the recovered master let consumers read up to: its flushed
    position under SYNC_FLUSH (nothing later lost is ever consumed), its
    written one otherwise."""
    final = run.nodes[0].final
    return int(final["flushed"] if run.params["flush"] == "SYNC_FLUSH" else final["wrote"])


def run_figures(run: RunInfo) -> dict[str, int | None] | None:
    """The consume figures of one run; None for a run without a consumer.
    The files were checked against the schema when the run was loaded."""
    consumed = os.path.join(run.run_dir, "consumed.jsonl")
    if not os.path.isfile(consumed):
        return None
    with open(os.path.join(run.run_dir, "consumer.json"), encoding="utf-8") as f:
        summary = json.load(f)
    committed = read_jsonl(os.path.join(run.run_dir, "committed.jsonl"))
    master = _ids(run.nodes[0], up_to=consumable_end(run))
    every = _ids(run.nodes[0])
    for n in run.nodes[1:]:
        every |= _ids(n)
    return figures(read_jsonl(consumed), consumable_master_ids=master, every_node_ids=every,
                   drained=bool(summary["drained"]), incarnations=int(summary["incarnations"]),
                   offsets_committed=len(committed))
