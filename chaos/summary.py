"""A one-line summary of a finished run, from its result directory, for the
matrix's live output. The verdict proper (promises, violations) is the
pipeline's; this only counts what a person watching wants to see at once."""

from __future__ import annotations

import json
import os

from chaos import consumption
from chaos.runs import load_run
from chaos.schema import SchemaError, read_jsonl


def one_line(run_dir: str) -> str:
    with open(os.path.join(run_dir, "params.json"), encoding="utf-8") as f:
        params = json.load(f)
    history = read_jsonl(os.path.join(run_dir, "history.jsonl"))
    acked = {h["msg_id"] for h in history if h["status"] == "PUT_OK"}
    held: dict[str, set[str]] = {}
    for node in params["nodes"]:
        rows = read_jsonl(os.path.join(run_dir, "nodes", node["name"], "records.jsonl"))
        held[node["name"]] = {r["msg_id"] for r in rows}
    master = params["nodes"][0]["name"]
    anywhere = set().union(*held.values())
    ahead = [o["slave_offset"] - o["master_offset"]
             for o in read_jsonl(os.path.join(run_dir, "observations.jsonl"))
             if o["kind"] == "slave_ahead" and o["slave_offset"] > o["master_offset"]]
    failed = sum(1 for h in history if h["status"] != "PUT_OK")
    parts = [f"{len(history)} puts", f"{len(acked)} acked",
             f"{len(acked - held[master])} acked lost on master",
             f"{len(acked - anywhere)} lost everywhere", f"{failed} not PUT_OK"]
    if ahead:
        parts.append(f"slave ahead by {max(ahead)} bytes")
    try:
        consumed = consumption.run_figures(load_run(run_dir, 0))
    except (SchemaError, ValueError, OSError) as exc:  # the report names it in full
        parts.append(f"consumer files unreadable ({exc})")
        consumed = None
    if consumed is not None:
        never = consumed["stored_never_delivered"]
        parts.append(f"consumer: {consumed['delivered']} delivered, "
                     f"{consumed['duplicates_delivered']} duplicates, "
                     f"{'?' if never is None else never} stored never delivered, "
                     f"{consumed['delivered_then_lost']} delivered then lost")
    return ", ".join(parts)
