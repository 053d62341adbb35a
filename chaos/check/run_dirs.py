"""The run directories as the pipeline sees them: found, their small files
(params.json, faults.jsonl, observations.jsonl, nodes/*/final.json) read and
checked against chaos/schema.py here, in Python; the two large files
(history.jsonl, nodes/*/records.jsonl) are only located — Spark reads them.

A run that fails a check becomes a Problem (the file and what is wrong) and
is left out of the report; the other runs are still reported.

This module also decides, per node, until when the scenario voided a
promise (see chaos/check/promises.py): `disk_void_until_ms` (the node's disk was
damaged at that time or later) and `copy_void_until_ms` (its disk was damaged,
or it crashed under crash_model power). A message invoked at or before the
time has its promise voided on that node.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from chaos.check import promises
from chaos.schema import (
    CONSUMER_NODE,
    FAULTS,
    FINAL,
    HISTORY,
    OBSERVATIONS,
    PARAMS,
    RECORDS,
    SchemaError,
    check_row,
    check_version,
    load_json_file,
    read_jsonl,
    validate_consumer_files,
)
from store.status import INDETERMINATE, PutStatus

NEVER_MS = -(2**63)  # no message is void
ALWAYS_MS = 2**63 - 1  # every message is void (the damage time is unknown)


@dataclass(frozen=True)
class Problem:
    """A run left out of the report: its directory, and what is wrong with
    which file (the message starts with the file's path)."""

    run_dir: str
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class NodeInfo:
    index: int  # position in params.nodes; 0 is the master
    name: str
    role: str
    records_path: str
    final: dict[str, Any]
    disk_void_until_ms: int
    copy_void_until_ms: int
    # Set by chaos.check.kept_stores when the run kept this node's store: the store
    # the records were read from again, and the first offset where it no
    # longer matches the read-back the run wrote (None: it matches).
    store_dir: str | None = None
    store_differs_at: int | None = None


@dataclass(frozen=True)
class RunInfo:
    index: int  # this report's number for the run (Spark joins on it)
    run_dir: str  # absolute
    params: dict[str, Any]
    nodes: tuple[NodeInfo, ...]
    faults: tuple[dict[str, Any], ...]
    observations: tuple[dict[str, Any], ...]

    @property
    def run_id(self) -> str:
        return str(self.params["run_id"])

    @property
    def history_path(self) -> str:
        return os.path.join(self.run_dir, "history.jsonl")

    def node(self, name: str) -> NodeInfo | None:
        return next((n for n in self.nodes if n.name == name), None)


def find_run_dirs(paths: Iterable[str]) -> list[str]:
    """Each path is a run directory (it holds params.json) or a directory
    under which run directories are found at any depth (a matrix's output).
    Raises FileNotFoundError for a path that is not a directory or has no
    run under it."""
    found: list[str] = []
    for path in paths:
        if not os.path.isdir(path):
            raise FileNotFoundError(f"{path}: not a directory")
        if os.path.isfile(os.path.join(path, "params.json")):
            found.append(os.path.abspath(path))
            continue
        below = []
        for root, dirs, files in os.walk(path):
            dirs.sort()
            if "params.json" in files:
                below.append(os.path.abspath(root))
                dirs.clear()  # a run's nodes/ holds no runs
        if not below:
            raise FileNotFoundError(
                f"{path}: no run directory (one holding params.json) under it")
        found.extend(below)
    return list(dict.fromkeys(found))  # a run named twice is read once


def void_until(
    *, name: str, crash_model: str, failpoint_spec: Any, final: dict[str, Any],
    faults: Sequence[dict[str, Any]],
) -> tuple[int, int]:
    """(disk_void_until_ms, copy_void_until_ms) of one node."""
    mine = [f for f in faults if f["node"] == name]
    damage = [f["start_ms"] for f in mine if f["damages_disk"]]
    if damage:
        disk = max(damage)
    elif final["disk_damaged"]:
        disk = ALWAYS_MS  # damaged, but no fault says when
    else:
        disk = NEVER_MS
    copy = disk
    if crash_model == "power":
        kills = [f["start_ms"] for f in mine if f["kind"] in ("kill", "lose")]
        crash_failpoint = "crash" in json.dumps(failpoint_spec or "")
        if final["killed"] and (not kills or crash_failpoint):
            copy = ALWAYS_MS  # it died at a time no fault row records
        elif kills:
            copy = max(copy, max(kills))
    return disk, copy


def _load_json(path: str) -> Any:
    if not os.path.isfile(path):
        raise SchemaError(f"{path}: missing")
    return load_json_file(path)


def _load_rows(path: str, fields: dict[str, tuple[str, bool, str]]) -> list[dict[str, Any]]:
    if not os.path.isfile(path):
        raise SchemaError(f"{path}: missing")
    rows = read_jsonl(path)
    for n, row in enumerate(rows, 1):
        check_row(row, fields, f"{path}:{n}")
    return rows


def load_run(run_dir: str, index: int) -> RunInfo:
    """Read and check one run's small files; raises SchemaError naming the
    file and what is wrong."""
    p_path = os.path.join(run_dir, "params.json")
    params = _load_json(p_path)
    check_row(params, PARAMS, p_path)
    # Runs written before the option existed recovered as RocketMQ does: they
    # cut corruption of flushed data.
    params.setdefault("corruption_policy", "truncate")
    check_version(params["schema_version"], p_path)
    if params["role"] not in promises.ROLES:
        raise SchemaError(f"{p_path}: role {params['role']!r} is not one of "
                          f"{', '.join(promises.ROLES)}")
    if params["flush"] not in promises.FLUSHES:
        raise SchemaError(f"{p_path}: flush {params['flush']!r} is not one of "
                          f"{', '.join(promises.FLUSHES)}")
    names: list[str] = []
    for i, node in enumerate(params["nodes"]):
        if not (isinstance(node, dict) and isinstance(node.get("name"), str)
                and isinstance(node.get("role"), str)):
            raise SchemaError(f"{p_path}: nodes[{i}] should be {{name, role}}, got {node!r}")
        if node["name"] in names or not node["name"] or "/" in node["name"]:
            raise SchemaError(f"{p_path}: nodes[{i}] has a bad or repeated name "
                              f"{node['name']!r}")
        names.append(node["name"])
    if not names:
        raise SchemaError(f"{p_path}: nodes is empty (the first node is the master)")

    faults = _load_rows(os.path.join(run_dir, "faults.jsonl"), FAULTS)
    for n, f in enumerate(faults, 1):
        for key in ("node", "peer"):
            if f[key] is not None and f[key] not in names and not (
                    key == "node" and f[key] == CONSUMER_NODE):
                raise SchemaError(f"{run_dir}/faults.jsonl:{n}: {key} {f[key]!r} "
                                  f"is not a node of the run ({', '.join(names)})")
    observations = _load_rows(os.path.join(run_dir, "observations.jsonl"), OBSERVATIONS)
    for n, o in enumerate(observations, 1):
        if o["kind"] != "slave_ahead":
            continue
        where = f"{run_dir}/observations.jsonl:{n}"
        for key in ("master", "slave", "master_offset", "slave_offset"):
            if o[key] is None:
                raise SchemaError(f"{where}: a slave_ahead observation needs {key!r}")
        for key in ("master", "slave"):
            if o[key] not in names:
                raise SchemaError(f"{where}: {key} {o[key]!r} is not a node of the run")

    nodes = []
    for i, node in enumerate(params["nodes"]):
        name = node["name"]
        node_dir = os.path.join(run_dir, "nodes", name)
        records = os.path.join(node_dir, "records.jsonl")
        if not os.path.isfile(records):
            raise SchemaError(f"{records}: missing")
        f_path = os.path.join(node_dir, "final.json")
        final = _load_json(f_path)
        check_row(final, FINAL, f_path)
        disk, copy = void_until(
            name=name, crash_model=params["crash_model"],
            failpoint_spec=params["failpoints"].get(name), final=final, faults=faults)
        nodes.append(NodeInfo(index=i, name=name, role=node["role"], records_path=records,
                              final=final, disk_void_until_ms=disk, copy_void_until_ms=copy))
    if not os.path.isfile(os.path.join(run_dir, "history.jsonl")):
        raise SchemaError(f"{run_dir}/history.jsonl: missing")
    validate_consumer_files(run_dir)  # small; absent for runs without a consumer
    return RunInfo(index=index, run_dir=run_dir, params=params, nodes=tuple(nodes),
                   faults=tuple(faults), observations=tuple(observations))


def load_runs(
    run_dirs: Sequence[str], tick: Callable[[], None] = lambda: None,
) -> tuple[list[RunInfo], list[Problem]]:
    runs: list[RunInfo] = []
    problems: list[Problem] = []
    by_id: dict[str, str] = {}
    for run_dir in run_dirs:
        try:
            run = load_run(run_dir, len(runs))
        except SchemaError as exc:
            problems.append(Problem(run_dir, str(exc)))
        else:
            if run.run_id in by_id:
                problems.append(Problem(
                    run_dir, f"{run_dir}/params.json: run_id {run.run_id!r} is also "
                    f"the run_id of {by_id[run.run_id]}"))
            else:
                by_id[run.run_id] = run_dir
                runs.append(run)
        tick()
    return runs, problems


STATUSES = frozenset(s.value for s in PutStatus) | {INDETERMINATE}


def check_large_row(row: Any, kind: str, where: str) -> None:
    """The schema, plus the value checks the pipeline makes on these rows
    (its Spark twin is report_inputs._bad_row): a known status; an offset, where
    given, not negative and a size, where given, positive."""
    check_row(row, LARGE_FILES[kind], where)
    if kind == "history" and row["status"] not in STATUSES:
        raise SchemaError(f"{where}: status {row['status']!r} is not a PutStatus name "
                          f"or {INDETERMINATE}")
    if (row["offset"] or 0) < 0 or (row["size"] is not None and row["size"] <= 0):
        raise SchemaError(f"{where}: offset {row['offset']} and size {row['size']} "
                          "(need offset >= 0, size > 0)")


LARGE_FILES = {"history": HISTORY, "records": RECORDS}


def first_row_problem(path: str, kind: str) -> str | None:
    """The first row of a large file that is wrong, named by line and field;
    None if Python finds none. Called only for the files Spark found bad rows
    in, so the message is exact without reading every file twice."""
    try:
        for n, row in enumerate(read_jsonl(path), 1):
            check_large_row(row, kind, f"{path}:{n}")
    except SchemaError as exc:
        return str(exc)
    return None
