"""Failover as a backend carries it out: `promote`, `lose` and `rejoin` in
the order every backend follows, around the rules of
cluster/backends/failover.py. A backend mixes this in and supplies the
steps that touch its processes or containers (the hooks below); what the
operations decide and in which order they change the state, the route and
the disk is written once, here (docs/design.md, "Failover: routing,
promotion, rejoin").

Ordering rules, for every backend:
- promote: the state and the route change first, before any node does: a
  failure half-way leaves the cluster described as it is meant to be
  (`start` finishes the job), and clients retry towards the new master
  while it restarts. Then the nodes whose role changes restart; then the
  links of the followers are read back from the new master.
- lose: the node is killed before its store is moved, and the store is
  moved (renamed, the directory fsynced) before the state says it is lost;
  a store that cannot be moved leaves the node stopped, not lost.
- rejoin: the state says the node is a slave before it starts, so it
  starts with a slave's command line.
"""

from __future__ import annotations

import os
import time
from typing import Any

from cluster.backends.failover import Promotion, decide_rejoin, plan_lose
from cluster.backends.interface import BackendError, NodeInfo, NodeState
from cluster.backends.state_dir import ClusterDir, check_name
from cluster.node.role import Role
from store.config import FlushMode
from store.log.segments import fsync_dir


class FailoverSteps(ClusterDir):
    # ------------------------------------------------ a backend supplies these
    def _running_names(self, state: dict[str, Any]) -> set[str]:
        """Nodes whose process runs (or is paused)."""
        raise NotImplementedError

    def _plan_promotion(self, state: dict[str, Any], name: str, *, running: set[str],
                        now_ms: int, role: Role | None, flush: FlushMode | None,
                        cut_off: frozenset[str]) -> Promotion:
        """failover.decide_promote, plus what this backend's links need."""
        raise NotImplementedError

    def _cut_off_from(self, state: dict[str, Any], name: str) -> frozenset[str]:
        """The nodes partitioned from node `name` (before a promotion
        changes any link)."""
        raise NotImplementedError

    def _switch_roles(self, state: dict[str, Any], plan: Promotion, name: str) -> None:
        """Restart plan.restart in their new roles (the new master first)
        and point the followers' links at `name`; the nodes' health is
        waited for by the caller."""
        raise NotImplementedError

    def _kill_for_loss(self, state: dict[str, Any], name: str) -> None:
        """SIGKILL node `name` if it runs and wait until it is gone; a
        BackendError saying nothing was moved if it will not die."""
        raise NotImplementedError

    def _start_as_slave(self, state: dict[str, Any], name: str, deadline: float) -> None:
        """Start node `name`, which the state now makes a slave of the
        route's master, and wait until it serves."""
        raise NotImplementedError

    def _wait_healthy(self, state: dict[str, Any], name: str, deadline: float) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------ operations
    def promote(self, name: str, *, role: Role | None = None, flush: FlushMode | None = None,
                timeout_s: float = 60.0) -> NodeInfo:
        """Make running slave `name` the master. It restarts as master on
        its own store rather than switching role in place: a broker in
        RocketMQ's classic master-slave mode changes role only by a restart
        with a new brokerRole (its manual failover), a clean stop flushes
        everything the slave received first, and a node keeps one start
        path per role. A running old master restarts as a slave the same
        way; slaves that only change master need no restart (their link
        now leads to the new master and their HA client reconnects).
        An old master partitioned from `name` is out of the operator's
        reach: it keeps running as a master until stopped (a second master;
        its next start is as `name`'s slave).
        The returned info's extra["links"]: each running follower's link
        once settled; extra["promoted_from"]: the old master;
        extra["cut_off"]: the nodes left running as a master."""
        with self._locked():
            state = self._load()
            running = self._running_names(state)
            plan = self._plan_promotion(state, name, running=running, now_ms=_now_ms(),
                                        role=role, flush=flush,
                                        cut_off=self._cut_off_from(state, name))
            self._save(state)
            self._publish_route(state)
            deadline = time.monotonic() + timeout_s
            self._switch_roles(state, plan, name)
            self._save(state)
            for n in plan.restart:
                self._wait_healthy(state, n, deadline)
            followers = [n for n in plan.followers if n in running and n not in plan.cut_off]
            links = self._link_states(state, followers, deadline)
            info = self._info(state, name)
            info.extra.update(links=links, promoted_from=plan.old_master,
                              cut_off=list(plan.cut_off))
            return info

    def lose(self, name: str) -> NodeInfo:
        """The machine of `name` is gone: SIGKILL its process (under its
        crash model, so under `power` the disk keeps only what was fsynced)
        and move its store aside, to nodes/NAME/lost-N, where no node opens
        it and the checker can still read it. Its data directory is left
        empty: `rejoin` starts a replacement machine there."""
        with self._locked():
            state = self._load()
            check_name(state, name)
            node_dir = self._path("nodes", name)
            where = plan_lose(state, name, now_ms=_now_ms(),
                              taken=set(os.listdir(node_dir)) if os.path.isdir(node_dir)
                              else set())
            self._kill_for_loss(state, name)
            self._power_cut(state, name)
            data = self._path("nodes", name, "data")
            try:
                os.rename(data, os.path.join(node_dir, where))
                os.makedirs(data)
                fsync_dir(node_dir)
            except OSError as exc:
                raise BackendError(f"node {name} was killed, but its store could not be moved "
                                   f"aside to {os.path.join(node_dir, where)}: {exc}; it is "
                                   "still in place (the node is stopped, not lost)") from None
            self._save(state)
            self._publish_route(state)
            return self._info(state, name)

    def rejoin(self, name: str, *, timeout_s: float = 60.0) -> NodeInfo:
        """Start node `name` (not running) as a slave of the current master,
        on whatever its data directory holds: its own log after a crash (an
        old master's, possibly ahead of the new one: the master's
        slave_ahead_policy decides at its first report), or nothing after
        `lose` (a replacement that catches up from offset 0). The returned
        info's extra["link"]: the link as the master reports it once settled
        (connected, or rejected), or as it was at the timeout."""
        with self._locked():
            state = self._load()
            decide_rejoin(state, name, running=self._running_names(state))
            self._save(state)
            deadline = time.monotonic() + timeout_s
            self._start_as_slave(state, name, deadline)
            link = self._link_states(state, [name], deadline)[name]
            info = self._info(state, name)
            info.extra["link"] = link
            return info

    # ---------------------------------------------------------------- query
    def _lost_state(self, state: dict[str, Any], name: str, node_state: NodeState,
                    extra: dict[str, Any]) -> NodeState:
        """A node's state as _info reports it, with its losses: where its
        stores were moved (extra["lost"]), LOST while it is lost and down."""
        n = state["nodes"][name]
        if n.get("lost_dirs"):
            extra["lost"] = [self._path("nodes", name, d) for d in n["lost_dirs"]]
        if n.get("lost") and node_state == NodeState.STOPPED:
            return NodeState.LOST
        return node_state


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
