"""The result directory of one chaos run: the contract between the harness
(which writes it) and the pipeline (which reads any number of them).

    RUN_DIR/
      params.json                 one object, PARAMS fields
      history.jsonl               one row per client operation, HISTORY fields
      faults.jsonl                one row per injected fault, FAULTS fields
      observations.jsonl          harness measurements during the run, OBSERVATIONS
      nodes/NAME/records.jsonl    every record read back from NAME's store after
                                  the run, RECORDS fields, in offset order
      nodes/NAME/final.json       NAME's final positions, FINAL fields
      nodes/NAME/node.log         the node's log (free text, not parsed)
      cluster/nodes/NAME/data/    NAME's store as the run left it, when the run
                                  keeps it (--keep-stores; params.json
                                  stores_kept and stores_kept_why say whether
                                  and why: chaos/check/keep_decision.py): `dlab
                                  report` reads it again and judges from it
                                  (chaos/check/kept_stores.py)
    and, only for scenarios that consume while producing (absent otherwise;
    a run without them is read as a run without a consumer):
      consumed.jsonl              one row per message the consumer was handed,
                                  CONSUMED fields, in delivery order
      committed.jsonl             one row per queue offset a broker accepted
                                  from the consumer, COMMITTED fields
      consumer.json               the consumer's summary, CONSUMER fields
      consumer/N.jsonl, N.log     each consumer incarnation's raw output
                                  (chaos/harness/consumer_proc.py; not read by the
                                  pipeline)

A fault row whose node is "consumer" (CONSUMER_NODE) acted on the consumer
process, not on a node.

Times are epoch milliseconds, except history's invoke_us and complete_us
(epoch microseconds, from schema_version 2: latencies are measured in µs).
Every JSON Lines file is UTF-8, one object a line. SCHEMA_VERSION changes
whenever a field changes meaning or is added; READABLE_VERSIONS are the
versions this dlab still reads (a version 1 history has no µs times and is
read at millisecond resolution).

Statuses in history.status are PutStatus names plus INDETERMINATE (both in
store/status.py): the call failed or timed out and the client cannot know
whether it was stored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)

# field name -> (type, nullable, meaning). Types: str, int, bool, float, list, dict.
PARAMS: dict[str, tuple[str, bool, str]] = {
    "schema_version": ("int", False, "SCHEMA_VERSION of the writer"),
    "run_id": ("str", False, "unique id of the run (scenario-role-flush-seed-...)"),
    "role": ("str", False, "SYNC_MASTER or ASYNC_MASTER"),
    "flush": ("str", False, "SYNC_FLUSH or ASYNC_FLUSH"),
    "scenario": ("str", False, "scenario name"),
    "seed": ("int", False, "the seed every random choice of the run derives from"),
    "backend": ("str", False, "local or compose"),
    "crash_model": ("str", False, "power or process"),
    "slave_ahead_policy": ("str", False, "reject, trust or truncate"),
    "ha_ship_limit": ("str", False, "wrote or flushed"),
    "nodes": ("list", False, "[{name, role}] in start order; the first is the master"),
    "failpoints": ("dict", False, "node name -> failpoint spec armed for the run"),
    "versions": ("dict", False, "dlab, python, grpcio versions"),
    "started_ms": ("int", False, "run start"),
    "ended_ms": ("int", False, "run end (after read-back)"),
}

HISTORY: dict[str, tuple[str, bool, str]] = {
    "op_id": ("int", False, "unique per run, in invoke order"),
    "msg_id": ("str", False, "UNIQ_KEY of the message (the same across retries)"),
    "producer": ("int", False, "producer number"),
    "attempt": ("int", False, "1 for the first send of msg_id, 2.. for client retries"),
    "invoke_ms": ("int", False, "when the call started"),
    "complete_ms": ("int", False, "when the answer (or the failure) came"),
    "invoke_us": ("int", False, "invoke time in epoch microseconds (from schema_version 2)"),
    "complete_us": ("int", False, "complete time in epoch microseconds (from schema_version "
                                  "2); complete_us - invoke_us is the latency"),
    "status": ("str", False, "PutStatus name or INDETERMINATE"),
    "offset": ("int", True, "CommitLog offset the node reported, null if none"),
    "size": ("int", True, "record size the node reported, null if none"),
    "node": ("str", False, "node the call went to"),
    "detail": ("str", True, "error text for failures"),
    "evidence": ("dict", True, "PUT_OK only: the positions the node answered on, "
                               "{wrote, flushed, acks: [{slave, acked, shipped}], by}, and "
                               "in controller mode quorum: {needed, members (null: any "
                               "slave)} (store/status.py Evidence); null otherwise, "
                               "absent in results written before it"),
}

FAULTS: dict[str, tuple[str, bool, str]] = {
    "fault_id": ("int", False, "in order of injection"),
    "kind": ("str", False, "kill, stop, start, restart, pause, resume, partition, heal, "
                           "torn_tail, bit_flip, failpoint, refused (a start the node's "
                           "corruption policy refused: it stays down), rogue_peer (an HA "
                           "stream reporting beyond the master's end)"),
    "node": ("str", True, "target node (null for a link fault)"),
    "peer": ("str", True, "other end for partition/heal"),
    "start_ms": ("int", False, "when the fault was injected"),
    "end_ms": ("int", True, "when it ended (resume/heal/restart done), null if it did not"),
    "damages_disk": ("bool", False, "true if it changed bytes on the node's disk"),
    "detail": ("str", True, "free text: offsets flipped, bytes torn, failpoint name"),
}

OBSERVATIONS: dict[str, tuple[str, bool, str]] = {
    "time_ms": ("int", False, "when it was measured"),
    "kind": ("str", False, "slave_ahead (measured when a crashed master came back), "
                           "settle, note"),
    "master": ("str", True, "master node name"),
    "slave": ("str", True, "slave node name"),
    "master_offset": ("int", True, "master's max offset after its recovery"),
    "slave_offset": ("int", True, "slave's max offset at that moment"),
    "detail": ("str", True, "free text"),
}

RECORDS: dict[str, tuple[str, bool, str]] = {
    "offset": ("int", False, "physical offset"),
    "size": ("int", False, "record size in bytes"),
    "msg_id": ("str", True, "UNIQ_KEY property, null if absent"),
    "body_crc": ("int", False, "BODYCRC as stored"),
    "store_timestamp_ms": ("int", False, "STORETIMESTAMP"),
    "record_hash": ("int", True, "64-bit hash of the record's whole bytes (chaos.harness.readback."
                                 "record_hash); absent in results written before it"),
}

# Fields added after SCHEMA_VERSION 1 was written: a row may lack them (older
# results still read) and is then read as if they were null.
OPTIONAL_FIELDS = frozenset({"record_hash", "invoke_us", "complete_us", "evidence"})

FINAL: dict[str, tuple[str, bool, str]] = {
    "name": ("str", False, "node name"),
    "role": ("str", False, "SYNC_MASTER, ASYNC_MASTER or SLAVE"),
    "min_offset": ("int", False, "first offset held"),
    "flushed": ("int", False, "flushed position at the end"),
    "wrote": ("int", False, "max offset at the end (== flushed after a clean stop)"),
    "first_bad_offset": ("int", True, "damage found by the final read-back, null if none"),
    "recoveries": ("list", False, "recovery summaries of every start of the node, in order"),
    "disk_damaged": ("bool", False, "a fault of the run changed bytes on this node's disk"),
    "killed": ("bool", False, "the node was SIGKILLed at least once during the run"),
}

CONSUMED: dict[str, tuple[str, bool, str]] = {
    "incarnation": ("int", False, "consumer process number: 1, then 2 after a restart, ..."),
    "msg_id": ("str", False, "UNIQ_KEY of the delivered message"),
    "topic": ("str", False, "topic"),
    "queue_id": ("int", False, "queue id"),
    "queue_offset": ("int", False, "QUEUEOFFSET of the message"),
    "commitlog_offset": ("int", False, "where its record was on the node that served it"),
    "node": ("str", False, "name of the node that served the pull (a consumer reads "
                           "from a slave while the master is down)"),
    "node_role": ("str", False, "that node's role"),
    "time_ms": ("int", False, "when the consumer was handed it (recorded before its "
                              "offset moved past it)"),
}

COMMITTED: dict[str, tuple[str, bool, str]] = {
    "incarnation": ("int", False, "consumer process number"),
    "topic": ("str", False, "topic"),
    "queue_id": ("int", False, "queue id"),
    "offset": ("int", False, "the next queue offset to consume, as committed"),
    "time_ms": ("int", False, "when the broker accepted it"),
}

CONSUMER: dict[str, tuple[str, bool, str]] = {
    "group": ("str", False, "consumer group"),
    "topic": ("str", False, "topic consumed"),
    "commit_interval_ms": ("int", False, "how often the consumer commits its offsets"),
    "incarnations": ("int", False, "consumer processes started in the run"),
    "exit_codes": ("list", False, "each incarnation's exit code in order: 0 clean, -9 "
                                  "SIGKILLed, 1 gave up (its N.log says why)"),
    "drain_started_ms": ("int", True, "when the harness asked the consumer to drain "
                                      "(after the load ended); null if it did not"),
    "drained": ("bool", False, "the last incarnation consumed until the cluster had nothing "
                               "more for it and stopped cleanly; when false, what was "
                               "stored but never delivered is unknown"),
    "ended_ms": ("int", True, "when the last incarnation stopped cleanly"),
    "end_offsets": ("dict", True, "queue id -> the last incarnation's next offset at its end"),
    "max_offsets": ("dict", True, "node name -> queue id -> the node's consumable max "
                                  "offset when the consumer ended"),
}

CONSUMER_NODE = "consumer"

FILES: dict[str, dict[str, tuple[str, bool, str]]] = {
    "params.json": PARAMS,
    "history.jsonl": HISTORY,
    "faults.jsonl": FAULTS,
    "observations.jsonl": OBSERVATIONS,
    "records.jsonl": RECORDS,
    "final.json": FINAL,
    "consumed.jsonl": CONSUMED,
    "committed.jsonl": COMMITTED,
    "consumer.json": CONSUMER,
}

_PY_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "float": (float, int),
    "list": (list,),
    "dict": (dict,),
}


class SchemaError(ValueError):
    """A result file does not match the schema; the message names the file,
    the line and the field."""


def check_row(row: Any, fields: Mapping[str, tuple[str, bool, str]], where: str) -> None:
    if not isinstance(row, dict):
        raise SchemaError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for name, (typ, nullable, _) in fields.items():
        if name not in row:
            if name in OPTIONAL_FIELDS:
                continue
            raise SchemaError(f"{where}: missing field {name!r}")
        value = row[name]
        if value is None:
            if not nullable:
                raise SchemaError(f"{where}: field {name!r} is null")
            continue
        ok = isinstance(value, _PY_TYPES[typ])
        if typ == "int" and isinstance(value, bool):
            ok = False
        if not ok:
            raise SchemaError(f"{where}: field {name!r} should be {typ}, got {value!r}")


def check_version(version: int, where: str) -> None:
    if version not in READABLE_VERSIONS:
        raise SchemaError(f"{where}: schema_version {version}, this dlab reads "
                          f"{' and '.join(map(str, READABLE_VERSIONS))}")


def write_json(path: str, obj: Mapping[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


# What json.dumps(row, sort_keys=True) builds for every row, built once (a
# sim run writes tens of thousands of rows; the encoder holds no state).
_SORTED_JSON = json.JSONEncoder(sort_keys=True)


def write_jsonl(path: str, rows: Iterable[Mapping[str, Any]]) -> None:
    tmp = path + ".tmp"
    encode = _SORTED_JSON.encode
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(encode(row))
            f.write("\n")
    os.replace(tmp, path)


def read_jsonl(path: str) -> list[dict[str, Any]]:
    rows = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise SchemaError(f"{path}:{n}: not UTF-8 text (byte 0x{raw[exc.start]:02x} "
                                  f"at column {exc.start + 1})") from None
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise SchemaError(f"{path}:{n}: not JSON ({exc.msg})") from None
    return rows


def load_json_file(path: str) -> Any:
    """One JSON document; SchemaError naming the file when it is not
    UTF-8 JSON."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SchemaError(f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
                          f"{exc.start})") from None
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None


def validate_run_dir(run_dir: str) -> list[str]:
    """Check every file of a run directory against the schema. Returns the
    node names; raises SchemaError naming the first problem."""

    def need(rel: str) -> str:
        path = os.path.join(run_dir, rel)
        if not os.path.isfile(path):
            raise SchemaError(f"{run_dir}: missing {rel}")
        return path

    params = load_json_file(need("params.json"))
    check_row(params, PARAMS, f"{run_dir}/params.json")
    check_version(params["schema_version"], f"{run_dir}/params.json")
    for rel, fields in (("history.jsonl", HISTORY), ("faults.jsonl", FAULTS),
                        ("observations.jsonl", OBSERVATIONS)):
        path = need(rel)
        for n, row in enumerate(read_jsonl(path), 1):
            check_row(row, fields, f"{path}:{n}")
    validate_consumer_files(run_dir)
    names = [n["name"] for n in params["nodes"]]
    for name in names:
        path = need(os.path.join("nodes", name, "records.jsonl"))
        for n, row in enumerate(read_jsonl(path), 1):
            check_row(row, RECORDS, f"{path}:{n}")
        final_path = need(os.path.join("nodes", name, "final.json"))
        final = load_json_file(final_path)
        check_row(final, FINAL, final_path)
    return names


def validate_consumer_files(run_dir: str) -> bool:
    """Check a run's consumer files: all three or none. Returns whether the
    run had a consumer; raises SchemaError naming the first problem."""
    paths = {rel: os.path.join(run_dir, rel)
             for rel in ("consumed.jsonl", "committed.jsonl", "consumer.json")}
    present = [rel for rel, path in paths.items() if os.path.isfile(path)]
    if not present:
        return False
    if len(present) != len(paths):
        missing = sorted(set(paths) - set(present))
        raise SchemaError(f"{run_dir}: has {', '.join(present)} but not {', '.join(missing)} "
                          "(a run's consumer files come together)")
    for rel, fields in (("consumed.jsonl", CONSUMED), ("committed.jsonl", COMMITTED)):
        for n, row in enumerate(read_jsonl(paths[rel]), 1):
            check_row(row, fields, f"{paths[rel]}:{n}")
    summary = load_json_file(paths["consumer.json"])
    check_row(summary, CONSUMER, paths["consumer.json"])
    return True
