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
    duration_ms: int = 10_000, params: Mapping[str, Any] | None = None,
) -> str:
    """Write one run directory; `records` maps node name -> its records, the
    first name being the master (after a failover: the master at the end);
    `params`: more of params.json (e.g. first_master). Returns the directory."""
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
        "started_ms": T0, "ended_ms": T0 + duration_ms, **(params or {}),
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


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark for the whole test session (start-up costs ~10 s).
    Under pytest-xdist (scripts/test) every test using it, directly or
    through another fixture, runs on one worker, so one JVM serves them all
    (tests/conftest.py puts them in the xdist group "spark"). A test that
    reports through Spark takes this fixture: without it, build_report
    starts and stops a JVM of its own."""
    with spark_session("local[2]") as session:
        yield session


# Four PUT_OKs at offsets 0..300; master and slave hold the first three.
LOSS_HISTORY = [op(i + 1, f"m{i + 1}", i * 100, at=i * 10) for i in range(4)]
THREE = [rec(0, "m1"), rec(100, "m2"), rec(200, "m3")]


def fixture_runs(root: str) -> None:
    # A SYNC_FLUSH master missing a PUT_OK: one violation; the same loss under
    # ASYNC_MASTER + ASYNC_FLUSH: an allowed loss; under SYNC_MASTER +
    # SYNC_FLUSH both promises break, still one violation.
    make_run(root, "loss-async-sync", role="ASYNC_MASTER", flush="SYNC_FLUSH",
             scenario="loss", history=LOSS_HISTORY, records={"m": THREE, "s": THREE})
    make_run(root, "loss-async-async", role="ASYNC_MASTER", flush="ASYNC_FLUSH",
             scenario="loss", history=LOSS_HISTORY, records={"m": THREE, "s": THREE})
    make_run(root, "loss-sync-sync", role="SYNC_MASTER", flush="SYNC_FLUSH",
             scenario="loss", history=LOSS_HISTORY, records={"m": THREE, "s": THREE})
    # SYNC_MASTER + ASYNC_FLUSH: the master lost m4, the slave kept it.
    make_run(root, "loss-sync-async-slave-kept", role="SYNC_MASTER", flush="ASYNC_FLUSH",
             scenario="loss", history=LOSS_HISTORY,
             records={"m": THREE, "s": [*THREE, rec(300, "m4")]})

    # Master crash under ASYNC_FLUSH with reject: the master lost m3 and m4,
    # the slave is ahead (200 bytes, 2 records); the restarted master wrote
    # m5 at offset 200 and holds m2 with other bytes than the slave.
    make_run(
        root, "diverge", role="ASYNC_MASTER", flush="ASYNC_FLUSH", scenario="master-crash",
        history=[*LOSS_HISTORY, op(5, "m5", 200, at=2000)],
        records={"m": [rec(0, "m1"), rec(100, "m2", crc=7), rec(200, "m5")],
                 "s": [rec(0, "m1"), rec(100, "m2", crc=8), rec(200, "m3"), rec(300, "m4")]},
        faults=[fault(1, "kill", "m", 1000, 1500)], final={"m": {"killed": True}},
        observations=[slave_ahead(1600, 200, 400)],
    )

    # A retried message stored twice on both nodes: one duplicate, two extra
    # copies. One indeterminate op was stored (m2's first attempt), one not.
    make_run(
        root, "dup", role="ASYNC_MASTER", flush="ASYNC_FLUSH", scenario="retry",
        history=[op(1, "m1", 0), op(2, "m2", None, status="INDETERMINATE", at=10, latency=3000),
                 op(3, "m2", 200, at=3100, attempt=2),
                 op(4, "m3", None, status="INDETERMINATE", at=3200, latency=3000)],
        records={"m": [rec(0, "m1"), rec(100, "m2"), rec(200, "m2")],
                 "s": [rec(0, "m1"), rec(100, "m2"), rec(200, "m2")]},
    )

    # trust policy: the restarted master took the slave's report at face
    # value and acknowledged m2 at offset 100, which the slave holds m_old at.
    make_run(
        root, "trust", role="SYNC_MASTER", flush="ASYNC_FLUSH", scenario="master-crash",
        policy="trust",
        history=[op(1, "m1", 0), op(2, "m_old", 100, at=10), op(3, "m2", 100, at=3000)],
        records={"m": [rec(0, "m1"), rec(100, "m2")],
                 "s": [rec(0, "m1"), rec(100, "m_old")]},
        faults=[fault(1, "kill", "m", 1000, 2000)], final={"m": {"killed": True}},
        observations=[slave_ahead(2000, 100, 200)],
    )

    # Voided promises (SYNC_MASTER + SYNC_FLUSH): the master's disk damaged at
    # 1000, the slave killed under the power model at 2000. m1 (invoked at
    # 500, gone everywhere) is void on both counts; m2 (invoked at 3000, gone
    # everywhere) violates both; m3 survived.
    make_run(
        root, "void", role="SYNC_MASTER", flush="SYNC_FLUSH", scenario="disk",
        history=[op(1, "m1", 0, at=500), op(2, "m2", 100, at=3000), op(3, "m3", 200, at=3100)],
        records={"m": [rec(200, "m3")], "s": [rec(200, "m3")]},
        faults=[fault(1, "bit_flip", "m", 1000, damages_disk=True),
                fault(2, "kill", "s", 2000, 2500)],
        final={"m": {"disk_damaged": True}, "s": {"killed": True}},
    )

    # Latency, order and availability: latencies 1, 2, 3, 4 ms (p50 2.5, p99
    # 3.97); producer 1's second ack is stored before its first
    # (one inversion); two failed puts in second 2, one in second 3.
    make_run(
        root, "timing", role="ASYNC_MASTER", flush="SYNC_FLUSH", scenario="timing",
        history=[op(1, "a", 100, at=0, latency=1, producer=1),
                 op(2, "b", 0, at=100, latency=2, producer=1),
                 op(3, "c", 200, at=200, latency=3, producer=2),
                 op(4, "d", 300, at=1200, latency=4, producer=2),
                 op(5, "e", None, status="SLAVE_NOT_AVAILABLE", at=2100, latency=1),
                 op(6, "f", None, status="SERVICE_NOT_AVAILABLE", at=2200, latency=1),
                 op(7, "g", None, status="INDETERMINATE", at=3000, latency=50)],
        records={"m": [rec(0, "b"), rec(100, "a"), rec(200, "c"), rec(300, "d")],
                 "s": [rec(0, "b"), rec(100, "a"), rec(200, "c"), rec(300, "d")]},
    )
    failover_run(root)
    # A second run of the same mode and scenario, for the comparison.
    # The slave paused at 20 ms, and no put succeeded after: unwritable
    # until the end (no promise of the mode involves the slave).
    make_run(
        root, "timing-2", role="ASYNC_MASTER", flush="SYNC_FLUSH", scenario="timing", seed=2,
        history=[op(1, "a", 0, latency=10), op(2, "b", None, status="FLUSH_DISK_TIMEOUT",
                                                at=50, latency=5000)],
        records={"m": [rec(0, "a"), rec(100, "b")], "s": [rec(0, "a")]},
        faults=[fault(1, "pause", "s", 20, 40)],
    )


def failover_run(root: str) -> str:
    """An isolated master (ASYNC_MASTER + ASYNC_FLUSH): m is cut off from s
    at 1000, s promoted at 3000, the link healed at 4000. m acknowledged m1
    (replicated) and m2 (cut off) as master, then m3 and m4 after the
    promotion: two split-brain acks. s, the master at the end, wrote n1..n4
    from offset 100 on, where m holds m2..m4: three records diverge, the
    first at offset 100. m2..m4 are lost by failover (allowed: nothing was
    promised), not stranded (s ends past m)."""
    def on(node: str, row: dict[str, Any]) -> dict[str, Any]:
        return {**row, "node": node}

    return make_run(
        root, "split-brain", role="ASYNC_MASTER", flush="ASYNC_FLUSH",
        scenario="isolated-master", params={"first_master": "m"},
        history=[op(1, "m1", 0), op(2, "m2", 100, at=1500), op(3, "m3", 200, at=3200),
                 op(4, "m4", 300, at=3300, producer=1),
                 on("s", op(5, "n1", 100, at=3100, producer=2)),
                 on("s", op(6, "n2", 200, at=3400, producer=2)),
                 on("s", op(7, "n3", 300, at=3500, producer=2)),
                 on("s", op(8, "n4", 400, at=3600, producer=2))],
        records={"s": [rec(0, "m1"), rec(100, "n1"), rec(200, "n2"), rec(300, "n3"),
                       rec(400, "n4")],
                 "m": [rec(0, "m1"), rec(100, "m2"), rec(200, "m3"), rec(300, "m4")]},
        faults=[fault(1, "partition", "m", 1000, 4000), fault(2, "promote", "s", 3000, 3000),
                fault(3, "heal", "m", 4000, 4000)])
