"""Small result directories with known contents for the pipeline tests,
written with chaos.schema's writers. Times are T0 + milliseconds; a record's
body_crc is derived from its message id unless a test gives one."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from chaos.schema import SCHEMA_VERSION, write_json, write_jsonl
from chaos.spark_session import spark_session

T0 = 1_700_000_000_000


def op(op_id: int, msg: str, offset: int | None, *, status: str = "PUT_OK", at: int = 0,
       latency: int = 5, producer: int = 0, attempt: int = 1, size: int = 100
       ) -> dict[str, Any]:
    """One history row: invoked at T0 + at ms, answered `latency` ms later."""
    stored = offset is not None
    return {
        "op_id": op_id, "msg_id": msg, "producer": producer, "attempt": attempt,
        "invoke_ms": T0 + at, "complete_ms": T0 + at + latency, "status": status,
        "offset": offset, "size": size if stored else None, "node": "m",
        "detail": None if status == "PUT_OK" else "fixture",
    }


def rec(offset: int, msg: str | None, *, size: int = 100, crc: int | None = None
        ) -> dict[str, Any]:
    if crc is None:
        crc = zlib.crc32((msg or "").encode()) & 0x7FFFFFFF
    return {"offset": offset, "size": size, "msg_id": msg, "body_crc": crc,
            "store_timestamp_ms": T0 + offset}


def fault(fault_id: int, kind: str, node: str | None, start: int, end: int | None = None, *,
          damages_disk: bool = False) -> dict[str, Any]:
    return {"fault_id": fault_id, "kind": kind, "node": node, "peer": None,
            "start_ms": T0 + start, "end_ms": None if end is None else T0 + end,
            "damages_disk": damages_disk, "detail": None}


def slave_ahead(at: int, master_offset: int, slave_offset: int, slave: str = "s"
                ) -> dict[str, Any]:
    return {"time_ms": T0 + at, "kind": "slave_ahead", "master": "m", "slave": slave,
            "master_offset": master_offset, "slave_offset": slave_offset, "detail": None}


def make_run(
    root: str, run_id: str, *, role: str, flush: str, history: Sequence[Mapping[str, Any]],
    records: Mapping[str, Sequence[Mapping[str, Any]]], scenario: str = "fixture",
    policy: str = "reject", crash_model: str = "power", seed: int = 1,
    faults: Sequence[Mapping[str, Any]] = (), observations: Sequence[Mapping[str, Any]] = (),
    final: Mapping[str, Mapping[str, Any]] | None = None, backend: str = "local",
    duration_ms: int = 10_000,
) -> str:
    """Write one run directory; `records` maps node name -> its records, the
    first name being the master. Returns the directory."""
    run_dir = os.path.join(root, run_id)
    names = list(records)
    os.makedirs(run_dir, exist_ok=True)
    write_json(os.path.join(run_dir, "params.json"), {
        "schema_version": SCHEMA_VERSION, "run_id": run_id, "role": role, "flush": flush,
        "scenario": scenario, "seed": seed, "backend": backend, "crash_model": crash_model,
        "slave_ahead_policy": policy, "ha_ship_limit": "wrote",
        "nodes": [{"name": n, "role": role if i == 0 else "SLAVE"}
                  for i, n in enumerate(names)],
        "failpoints": {}, "versions": {"dlab": "test"},
        "started_ms": T0, "ended_ms": T0 + duration_ms,
    })
    write_jsonl(os.path.join(run_dir, "history.jsonl"), history)
    write_jsonl(os.path.join(run_dir, "faults.jsonl"), faults)
    write_jsonl(os.path.join(run_dir, "observations.jsonl"), observations)
    for i, name in enumerate(names):
        node_dir = os.path.join(run_dir, "nodes", name)
        os.makedirs(node_dir, exist_ok=True)
        rows = list(records[name])
        write_jsonl(os.path.join(node_dir, "records.jsonl"), rows)
        end = max((r["offset"] + r["size"] for r in rows), default=0)
        write_json(os.path.join(node_dir, "final.json"), {
            "name": name, "role": role if i == 0 else "SLAVE",
            "min_offset": min((r["offset"] for r in rows), default=0),
            "flushed": end, "wrote": end, "first_bad_offset": None, "recoveries": [],
            "disk_damaged": False, "killed": False,
            **((final or {}).get(name, {})),
        })
    return run_dir


# Under pytest-xdist (scripts/test) each worker would start its own JVM for
# the fixture below; the modules using it share one worker, and one JVM.
one_spark_user = pytest.mark.xdist_group("spark")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark for the whole test session (start-up costs ~10 s)."""
    with spark_session("local[2]") as session:
        yield session
