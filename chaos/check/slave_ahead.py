"""Slave-ahead gaps: where a slave held more than its master, at a restart
of the master (slave_ahead observations) or at the end of the run, and
which slaves the serving master therefore rejects or ignores."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from chaos.check.failover import lost_at_end
from chaos.check.run_dirs import RunInfo

# run, observation, slave node, master offset, slave offset, at the end of the run
Observation = tuple[int, int, int, int, int, bool]


def run_ahead_observations(run: RunInfo) -> list[Observation]:
    """A run's slave-ahead gaps: every slave_ahead observation with the slave
    ahead (at a restart of the master), then every slave whose end of data
    after the run is past the master's (numbered after the observations)."""
    obs: list[Observation] = []
    for n, o in enumerate(run.observations):
        if o["kind"] == "slave_ahead" and o["slave_offset"] > o["master_offset"]:
            slave = run.node(o["slave"])
            assert slave is not None  # checked by runs.load_run
            obs.append((run.index, n, slave.index, o["master_offset"], o["slave_offset"],
                        False))
    master_end = int(run.nodes[0].final["wrote"])
    lost = lost_at_end(run.faults)  # a lost machine's store is evidence, no slave
    for slave in run.nodes[1:]:
        if int(slave.final["wrote"]) > master_end and slave.name not in lost:
            obs.append((run.index, len(run.observations) + slave.index, slave.index,
                        master_end, int(slave.final["wrote"]), True))
    return obs


def ahead_observations(runs: Sequence[RunInfo]) -> list[Observation]:
    return [o for run in runs for o in run_ahead_observations(run)]


def ignored_slaves(run: RunInfo) -> int:
    """Bit mask (bit i: node i) of the slaves the serving master rejects or
    ignores: found ahead of it, at its restart or at the end of the run,
    under the reject policy (the master refuses the slave) or trust (it
    believes the slave's offset and never reads what the slave holds past
    its own). Under truncate the slave cuts back to the master."""
    if run.params["slave_ahead_policy"] not in ("reject", "trust"):
        return 0
    mask = 0
    for o in run_ahead_observations(run):
        mask |= 1 << o[2]
    return mask


def ahead_table(spark: SparkSession, obs: Sequence[Observation]) -> DataFrame:
    """Per run with slave_ahead observations, the k-th one's slave node and
    gap as node_k, lo_k, hi_k (broadcast; null past the run's last)."""
    by_run: dict[int, list[Observation]] = {}
    for o in obs:
        by_run.setdefault(o[0], []).append(o)
    slots = max(len(v) for v in by_run.values())
    rows = [(run, *[x for k in range(slots) for x in (
        (v[k][2], v[k][3], v[k][4]) if k < len(v) else (None, None, None))])
        for run, v in by_run.items()]
    # Not null: see chaos/report/inputs.py _read_large.
    return F.broadcast(spark.createDataFrame(rows, ", ".join(
        ["run int not null"] + [f"node_{k} int, lo_{k} long, hi_{k} long"
                                for k in range(slots)])))


def ahead_messages(divergence: pd.DataFrame, obs: Sequence[Observation]) -> pd.DataFrame:
    """(run, obs, messages) from the divergence branch's ahead{k} columns
    (see ahead_table for the order); a run without records has no row."""
    counts = divergence.set_index("run")
    rows, slot = [], 0
    for i, (run, n, _, _, _, _) in enumerate(obs):
        slot = slot + 1 if i and obs[i - 1][0] == run else 0
        if run in counts.index:
            rows.append((run, n, int(counts.at[run, f"ahead{slot}"])))
    return pd.DataFrame(rows, columns=["run", "obs", "messages"])
