"""The consume-side checker: what a run's consumer was handed, against what
the nodes hold after the run.

Per run that consumed (it has consumed.jsonl):
- `delivered`: messages handed to the consumer, repeats included;
- `duplicates_delivered`: deliveries beyond the first of each message id
  (a consumer killed between offset commits, or a broker that lost
  committed offsets in a crash, is handed them again);
- `stored_never_delivered`: ids in the master's recovered store that the
  consumer never got, although it drained the cluster at the end (a
  consumer must never skip a stored message);
- `delivered_then_lost`: ids the consumer got that no node holds after the
  run — consumed before they were durable;
- `consumer_incarnations`: consumer processes the run started.

It does not check order (a pull consumer reads each queue in queue-offset
order by construction) nor what the consumer did with a message. Runs
without consumed.jsonl have no consume figures (None), not zeros.

The files are small (one row per delivered message), so this reads them
directly rather than through the Spark query.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from chaos.runs import RunInfo
from chaos.schema import read_jsonl


def _record_ids(path: str) -> set[str]:
    out: set[str] = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                mid = json.loads(line).get("msg_id")
                if mid is not None:
                    out.add(mid)
    return out


def figures(deliveries: Iterable[dict[str, Any]], master_ids: set[str],
            every_node_ids: set[str]) -> dict[str, int]:
    """The checker itself: pure, over rows and id sets."""
    delivered = 0
    seen: set[str] = set()
    incarnations = 0
    for row in deliveries:
        delivered += 1
        seen.add(row["msg_id"])
        incarnations = max(incarnations, int(row["incarnation"]))
    return {
        "delivered": delivered,
        "duplicates_delivered": delivered - len(seen),
        "stored_never_delivered": len(master_ids - seen),
        "delivered_then_lost": len(seen - every_node_ids),
        "consumer_incarnations": incarnations,
    }


def run_figures(run: RunInfo) -> dict[str, int] | None:
    path = os.path.join(run.run_dir, "consumed.jsonl")
    if not os.path.isfile(path):
        return None
    master_ids = _record_ids(run.nodes[0].records_path)
    every = set(master_ids)
    for n in run.nodes[1:]:
        every |= _record_ids(n.records_path)
    return figures(read_jsonl(path), master_ids, every)
