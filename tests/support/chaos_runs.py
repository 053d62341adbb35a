"""Chaos runs for the tests: a scenario run on its backend with a small
workload, and the live processes a cluster left behind."""

from __future__ import annotations

import os
from typing import Any

from chaos.harness import scenarios
from chaos.harness.run_config import RunConfig
from chaos.harness.workload import WorkloadConfig
from chaos.matrix.launch import make_run

SMALL = WorkloadConfig(producers=2, body_min_bytes=256, body_max_bytes=1024)


def run_scenario(tmp: str, scenario: str, role: str, flush: str, seed: int, **kw: Any) -> str:
    cfg = RunConfig(scenario=scenarios.get(scenario), role=role, flush=flush, seed=seed,
                    out_dir=tmp, workload=SMALL, **kw)
    return make_run(cfg).execute()


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line names `text` (nodes and proxies of
    a cluster carry its directory in their arguments)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found
