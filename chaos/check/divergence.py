"""The divergence rule: where a slave's log differs from its master's.

It verifies: on the range the master and a slave both hold (the larger of
their first offsets to the smaller of their ends), every master record is
held by the slave byte for byte at the same offset — the same size, body
CRC, message id and hash of the whole record (0 in read-backs written
before the hash was recorded: then id, size and CRC decide). A master
record that some slave holds otherwise is one divergent record, however
many slaves differ. Only offsets where a master record starts count: a
slave record starting elsewhere in the common range lies inside a master
record that differs (records tile both logs), which is counted already.

It does not judge which side is right, nor what lies outside the common
range (a slave ahead of its master: chaos/check/slave_ahead.py).

The one home of the rule: `dlab chaos bugs --check` (chaos/commands/bugs.py)
calls `divergence` per run, and the Spark report (chaos/report/pipeline.py)
calls `divergence_group` on each run's records;
tests/chaos/test_verdict_paths.py holds the two to the same answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import pandas as pd

# What the report's query hands each run's group (chaos/report/pipeline.py).
FRAME_SCHEMA = "run int, divergent_records long, first_divergent_offset long"


class LogRecord(NamedTuple):
    offset: int
    size: int
    identity: tuple[Any, ...]


def identity(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """What must be equal for two records at one offset to be the same."""
    return (row["size"], row["body_crc"], row["msg_id"], row.get("record_hash") or 0)


def divergent_offsets(master: Sequence[LogRecord],
                      slaves: Sequence[Sequence[LogRecord]]) -> list[int]:
    """The offsets of the master's divergent records (the module docstring's
    rule), in order."""
    if not master:
        return []
    lo0 = min(r.offset for r in master)
    hi0 = max(r.offset + r.size for r in master)
    differing: set[int] = set()
    for slave in slaves:
        if not slave:
            continue
        lo = max(lo0, min(r.offset for r in slave))
        hi = min(hi0, max(r.offset + r.size for r in slave))
        at = {r.offset: r.identity for r in slave}
        differing.update(r.offset for r in master
                         if lo <= r.offset < hi and at.get(r.offset) != r.identity)
    return sorted(differing)


def divergence(nodes: Sequence[Sequence[Mapping[str, Any]]]) -> tuple[int, int | None]:
    """(divergent records, the first one's offset) of a run whose nodes'
    well-formed read-back rows are `nodes`, the master first."""
    if not nodes:
        return 0, None
    logs = [[LogRecord(r["offset"], r["size"], identity(r)) for r in rows] for rows in nodes]
    found = divergent_offsets(logs[0], logs[1:])
    return len(found), (found[0] if found else None)


def divergence_group(pdf: pd.DataFrame) -> pd.DataFrame:
    """`divergence` over one run's records as the report's query groups them
    (columns run, node — 0 the master — offset, size, body_crc, msg_id,
    record_hash, bad): one row (run, divergent_records,
    first_divergent_offset). Malformed rows are left out, as everywhere."""
    run = int(pdf["run"].iloc[0])
    good = pdf[~pdf["bad"].fillna(True).astype(bool)]
    by_node: dict[int, list[dict[str, Any]]] = {}
    for row in good.to_dict("records"):
        if pd.isna(row.get("record_hash")):
            row["record_hash"] = 0
        if pd.isna(row.get("msg_id")):
            row["msg_id"] = None
        by_node.setdefault(int(row["node"]), []).append(row)
    n = max(by_node, default=-1) + 1
    count, first = divergence([by_node.get(i, []) for i in range(n)])
    return pd.DataFrame({"run": [run], "divergent_records": [count],
                         "first_divergent_offset": [first]}).astype(
        {"first_divergent_offset": "Int64"})
