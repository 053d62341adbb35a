"""Judge a run from the stores it kept, not from a snapshot of them.

A run writes each node's read-back (nodes/NAME/records.jsonl, final.json) at
its end and, unless told not to, keeps the stores themselves under
cluster/nodes/NAME/data/ (chaos/harness/runner.py). Before the Spark job, `dlab
report` reads every kept store again with the project's codec
(chaos.harness.readback.read_back), read-only, and the job judges from that: a
record flipped, zeroed or rewritten on disk after the run is seen as what it
is on disk now. Per node it also keeps what a user must be told:

- where the store holds damage (a record that fails its checks before the
  end of data: final `first_bad_offset`, reported per node), and
- the first offset where the store no longer matches the run's own
  read-back (`store_differs_at`): the verdict is not the one the run's
  files would give, and the report says so, naming run, node and offset.

A node without a kept store is judged from its read-back, as before.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from chaos.check.run_dirs import Problem, RunInfo, check_large_row
from chaos.harness.readback import read_back
from chaos.schema import SchemaError, read_jsonl, write_jsonl

_COMPARED = ("offset", "size", "msg_id", "body_crc", "store_timestamp_ms")


def store_dir(run_dir: str, node: str) -> str:
    """Where a run keeps a node's store (cluster/local.py and
    cluster/compose.py both put it at <cluster dir>/nodes/NAME/data)."""
    return os.path.join(run_dir, "cluster", "nodes", node, "data")


def first_difference(recorded: Sequence[dict[str, Any]], on_disk: Sequence[dict[str, Any]]
                     ) -> int | None:
    """The lowest offset where the two record lists disagree: a record one
    holds and the other does not, or one with other fields. Whole-record
    hashes are compared when both sides have them (older read-backs do not)."""
    for a, b in zip(recorded, on_disk, strict=False):
        keys = _COMPARED + (("record_hash",) if a.get("record_hash") is not None
                            and b.get("record_hash") is not None else ())
        if any(a.get(k) != b.get(k) for k in keys):
            return min(a["offset"], b["offset"])
    if len(recorded) != len(on_disk):
        extra = recorded[len(on_disk)] if len(recorded) > len(on_disk) else on_disk[len(recorded)]
        return int(extra["offset"])
    return None


def reread(runs: Sequence[RunInfo], work_dir: str, tick: Callable[[], None] = lambda: None
           ) -> tuple[list[RunInfo], list[Problem]]:
    """The runs with every kept store read again: a node's records_path then
    names a file in `work_dir` holding the store's records, and its final
    positions and first_bad_offset are the store's. A run whose read-back
    breaks the schema is a Problem (it would be one anyway) and left out."""
    out: list[RunInfo] = []
    problems: list[Problem] = []
    for run in runs:
        nodes = []
        try:
            for node in run.nodes:
                data = store_dir(run.run_dir, node.name)
                if not os.path.isdir(os.path.join(data, "commitlog")):
                    nodes.append(node)
                    continue
                recorded = read_jsonl(node.records_path)
                for n, row in enumerate(recorded, 1):
                    check_large_row(row, "records", f"{node.records_path}:{n}")
                rb = read_back(data)
                path = os.path.join(work_dir, f"run{run.index}-node{node.index}.jsonl")
                write_jsonl(path, rb.records)
                final = {**node.final, "min_offset": rb.min_offset, "flushed": rb.end_offset,
                         "wrote": rb.end_offset, "first_bad_offset": rb.first_bad_offset,
                         "bad_reason": rb.bad_reason}
                nodes.append(replace(node, records_path=path, final=final, store_dir=data,
                                     store_differs_at=first_difference(recorded, rb.records)))
        except SchemaError as exc:
            problems.append(Problem(run.run_dir, str(exc)))
        except UnicodeDecodeError as exc:
            problems.append(Problem(run.run_dir, f"{node.records_path}: not UTF-8 ({exc})"))
        except OSError as exc:
            problems.append(Problem(run.run_dir, f"{exc.filename or data}: cannot read the "
                                    f"kept store ({exc.strerror}); fix its permissions, or "
                                    f"move {os.path.join(run.run_dir, 'cluster')} aside "
                                    "to judge the run from its read-back"))
        else:
            # Renumbered: the pipeline keys its results by a run's place in the list.
            out.append(replace(run, index=len(out), nodes=tuple(nodes)))
        tick()
    return out, problems
