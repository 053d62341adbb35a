"""The local backend: every node a `dlab node` process on this host, bound to
127.0.0.1, each slave reaching its master through a cuttable TCP proxy
(cluster/backends/proxy.py) so `partition` is a real network fault.

Cluster state lives in DIR/cluster.json (written under DIR/cluster.lock), so
separate CLI invocations — `dlab cluster up` now, `dlab cluster kill master`
later — act on the same cluster. A process is identified by pid and start
time, never by pid alone. Nodes and proxies run in their own sessions and
outlive the command that started them; `down` ends them.

Under the `power` crash model a node that dies (`kill`, a crash failpoint)
leaves its store as a power cut would: before it restarts or the cluster
goes down, every byte no completed fsync covered is discarded
(ClusterDir._power_cut in cluster/backends/state_dir.py, store/log/durable_mark.py).

In controller mode every node reaches every other, and the controller,
through a link proxy of its own (cluster/backends/controller_links.py), so
`partition` cuts any pair of nodes, or a node from the controller.

Layout of DIR (see cluster/backends/interface.py): cluster.json, token (0600),
nodes/NAME/data (the store), nodes/NAME/node.log, proxies/NAME.json and
proxies/NAME.log (the link proxy of slave NAME; in controller mode
proxies/FROM.TO.json and .log, FROM's link to TO).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from typing import Any

from cluster.backends import controller_links
from cluster.backends.controller_mode import ControllerSteps, check_controller_spec
from cluster.backends.dir_files import append_no_link, write_token
from cluster.backends.failover import (
    Promotion,
    follow_through_proxy,
    plan_promote,
    refuse_lost,
    route_of,
)
from cluster.backends.interface import (
    REFUSAL_FILE,
    BackendError,
    ClusterSpec,
    ControllerSpec,
    NodeInfo,
    NodeSpec,
    NodeState,
    read_refusal,
)
from cluster.backends.procs import ChildProcesses, ProcId, free_ports
from cluster.backends.state_dir import (
    STATE_FILE,
    STATE_VERSION,
    NodeRefusedError,
    check_name,
)
from cluster.node.role import Role
from cluster.node.route import ROUTE_FILE
from ha.config import HAMode, ShipLimit, SlaveAheadPolicy
from store.config import CorruptionPolicy, CrashModel, FlushMode

HOST = "127.0.0.1"
STOP_TIMEOUT_S = 30.0


def spec_to_dict(spec: NodeSpec) -> dict[str, Any]:
    d = dataclasses.asdict(spec)
    d["role"] = spec.role.value
    d["slave_ahead_policy"] = spec.slave_ahead_policy.value
    d["ha_ship_limit"] = spec.ha_ship_limit.value
    d["ha_mode"] = spec.ha_mode.value
    d["extra_args"] = list(spec.extra_args)
    return d


def spec_from_dict(d: dict[str, Any]) -> NodeSpec:
    d = dict(d)
    d["role"] = Role(d["role"])
    d["flush"] = FlushMode(d["flush"])
    d["crash_model"] = CrashModel(d["crash_model"])
    d["slave_ahead_policy"] = SlaveAheadPolicy(d["slave_ahead_policy"])
    d["ha_ship_limit"] = ShipLimit(d["ha_ship_limit"])
    d["corruption_policy"] = CorruptionPolicy(d.get("corruption_policy", "refuse"))
    d["extra_args"] = tuple(d.get("extra_args", ()))
    d["emulate"] = tuple(d.get("emulate", ()))
    d["ha_mode"] = HAMode(d.get("ha_mode", HAMode.CLASSIC.value))
    return NodeSpec(**d)


class LocalBackend(ControllerSteps):
    name = "local"

    def __init__(self, directory: str | None = None, *, python: str | None = None) -> None:
        """`directory`: a cluster directory to attach to (a later `up` may
        also set it). `python`: the interpreter that runs `dlab node`."""
        self.directory = os.path.abspath(directory) if directory else None
        self.python = python or sys.executable
        self._children = ChildProcesses()  # the nodes and proxies this backend started

    # ------------------------------------------------------------------ up
    def up(self, spec: ClusterSpec, *, token: str, timeout_s: float = 60.0) -> list[NodeInfo]:
        self.directory = os.path.abspath(spec.directory)
        names = [n.name for n in spec.nodes]
        if len(set(names)) != len(names):
            raise BackendError(f"node names must be unique, got {names}")
        if spec.master.role == Role.SLAVE:
            raise BackendError("the master's role must be SYNC_MASTER or ASYNC_MASTER")
        for s in spec.slaves:
            if s.role != Role.SLAVE:
                raise BackendError(f"slave {s.name} must have role SLAVE, not {s.role.value}")
        with self._locked(create=True):
            if os.path.exists(self._path(STATE_FILE)):
                old = self._load()
                alive = [n for kind in ("nodes", "proxies") for n, v in old[kind].items()
                         if self._children.state(_pid(v)) != "gone"]
                if old.get("controller") and \
                        self._children.state(_pid(old["controller"])) != "gone":
                    alive.append("the controller")
                if alive:
                    raise BackendError(
                        f"a cluster is already up in {self._dir()} ({', '.join(alive)} "
                        f"running); run `dlab cluster down --dir {self._dir()}` first")
            os.makedirs(self._path("proxies"), exist_ok=True)
            write_token(self._path("token"), token)
            if spec.controller_mode:
                return self._up_controller_mode(spec, time.monotonic() + timeout_s)
            ports = free_ports(len(spec.nodes) + len(spec.slaves))
            state: dict[str, Any] = {
                "version": STATE_VERSION, "backend": self.name, "master": spec.master.name,
                "started_ms": time.time_ns() // 1_000_000, "nodes": {}, "proxies": {},
            }
            state["route"] = {"master": spec.master.name, "since_ms": state["started_ms"],
                              "epoch": 1}
            master_port = ports[0]
            for i, ns in enumerate(spec.nodes):
                state["nodes"][ns.name] = self._new_node_entry(ns, ports[i])
            for j, ns in enumerate(spec.slaves):
                pport = ports[len(spec.nodes) + j]
                state["nodes"][ns.name]["master_via"] = f"{HOST}:{pport}"
                state["proxies"][ns.name] = {"port": pport, "target": f"{HOST}:{master_port}",
                                             "pid": None, "start_time": None, "cut": False}
            self._save(state)
            self._publish_route(state)
            with self._coming_up(state):
                self._start_all(state, spec, time.monotonic() + timeout_s)
            return [self._info(state, n) for n in state["nodes"]]

    def _start_all(self, state: dict[str, Any], spec: ClusterSpec, deadline: float) -> None:
        """Proxies, then the slaves, then the master once the slaves serve:
        a master that recovers with corruption_policy repair fetches from
        its slaves before it listens itself (cluster/node/repair.py)."""
        self._start_proxies(state, list(state["proxies"]))
        refusals: list[NodeRefusedError] = []
        for group in (spec.slaves, (spec.master,)):
            for ns in group:
                self._spawn_node(state, ns.name)
            self._save(state)
            for ns in group:
                try:
                    self._wait_healthy(state, ns.name, deadline)
                except NodeRefusedError as exc:
                    refusals.append(exc)  # the others still start: a repair needs them
        if refusals:
            raise refusals[0]
        self._wait_replicating(state, deadline)

    # ------------------------------------------------------ controller mode
    # One `dlab controller run` process (its state in DIR/controller, its
    # log DIR/controller.log, loopback, the cluster token) elects the
    # master; it publishes DIR/route.json at every change of master
    # (cluster/controller/route_publisher.py), so the backend writes no
    # route of its own. Every node reaches the others and the controller
    # through link proxies (cluster/backends/controller_links.py): a node
    # follows the master the controller names through its own proxy to it
    # (`dlab node --peer-address`), so a partition cuts one pair of nodes.
    def _up_controller_mode(self, spec: ClusterSpec, deadline: float) -> list[NodeInfo]:
        ctl = spec.controller or ControllerSpec()
        check_controller_spec(spec)
        names = [ns.name for ns in spec.nodes]
        n_nodes = len(names)
        ports = free_ports(n_nodes + 1 + controller_links.links_needed(n_nodes))
        started = time.time_ns() // 1_000_000
        controller_port = ports[n_nodes]
        state: dict[str, Any] = {
            "version": STATE_VERSION, "backend": self.name, "master": spec.master.name,
            "started_ms": started, "nodes": {}, "proxies": {},
            "controller": {"port": controller_port, "address": f"{HOST}:{controller_port}",
                           "pid": None, "start_time": None, "starts": 0,
                           "settings": dataclasses.asdict(ctl)},
        }
        for i, ns in enumerate(spec.nodes):
            state["nodes"][ns.name] = self._new_node_entry(ns, ports[i])
        state["proxies"] = controller_links.plan_links(
            names, state["controller"]["address"], HOST, ports[n_nodes + 1:],
            {n: v["address"] for n, v in state["nodes"].items()})
        # A route left by an earlier cluster in DIR names its addresses.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(ROUTE_FILE))
        self._save(state)
        with self._coming_up(state):
            self._start_proxies(state, list(state["proxies"]))
            self._save(state)
            self._start_controller(state, deadline)
            self._save(state)
            # The first broker to ask is elected (a new broker set's first
            # master): the spec's master starts alone and asks first.
            self._spawn_node(state, spec.master.name)
            self._save(state)
            self._wait_healthy(state, spec.master.name, deadline)
            self._wait_controller_master(state, deadline)
            for ns in spec.slaves:
                self._spawn_node(state, ns.name)
            self._save(state)
            for ns in spec.slaves:
                self._wait_healthy(state, ns.name, deadline)
            state["master"] = self._wait_route_master(deadline)
            self._save(state)
            self._wait_replicating(state, deadline)
        return [self._info(state, n) for n in state["nodes"]]

    def _new_node_entry(self, ns: NodeSpec, port: int) -> dict[str, Any]:
        """A node's entry in a new cluster's state, its data directory made."""
        os.makedirs(self._path("nodes", ns.name, "data"), exist_ok=True)
        return {"spec": spec_to_dict(ns), "port": port, "address": f"{HOST}:{port}",
                "pid": None, "start_time": None, "failpoints": ns.failpoints,
                "master_via": None, "starts": 0}

    def _start_controller(self, state: dict[str, Any], deadline: float) -> None:
        """Start `dlab controller run` and wait until its health check says
        SERVING (its state read, its port bound)."""
        c = state["controller"]
        os.makedirs(self._path("controller"), exist_ok=True)
        log_path = self._path("controller.log")
        cmd = [self.python, "-m", "cluster.cli", "controller", "run",
               "--dir", self._path("controller"), "--token-file", self._path("token"),
               "--listen", c["address"], "--publish-route", self._dir(),
               *ControllerSpec(**c["settings"]).args()]
        with open(append_no_link(log_path), "ab") as f:
            f.write(f"---- {time.strftime('%Y-%m-%d %H:%M:%S')} dlab cluster: starting the "
                    f"controller (start {c['starts'] + 1})\n".encode())
        proc = self._children.spawn(cmd, log_path=log_path, env=node_env())
        c["pid"], c["start_time"] = proc.pid, proc.start_time
        c["starts"] += 1
        self._wait_controller_serving(
            state, deadline,
            exited=lambda: (f"its log says: {_tail(log_path)}"
                            if self._children.state(proc) == "gone" else None))

    def kill_controller(self) -> None:
        """Controller mode: SIGKILL the controller's process (its state file
        is written durably before every answer, so it loses nothing it
        answered); no election happens until `start_controller`."""
        with self._locked():
            state = self._load()
            c = state.get("controller")
            if not c:
                raise BackendError("this cluster runs no controller (classic mode)")
            proc = _pid(c)
            if self._children.state(proc) == "gone":
                raise BackendError("cannot kill the controller: it is not running")
            self._children.signal(proc, signal.SIGKILL)
            if not self._children.wait_state(proc, {"gone"}, 10):
                raise BackendError(f"the controller (pid {c['pid']}) did not die after SIGKILL")

    def start_controller(self, *, timeout_s: float = 60.0) -> None:
        """Controller mode: start the controller again on its state
        directory and address; returns once it serves. A restarted
        controller judges no broker alive or dead until it hears from it."""
        with self._locked():
            state = self._load()
            c = state.get("controller")
            if not c:
                raise BackendError("this cluster runs no controller (classic mode)")
            if self._children.state(_pid(c)) != "gone":
                raise BackendError("the controller is already running")
            try:
                self._start_controller(state, time.monotonic() + timeout_s)
            finally:
                self._save(state)

    def controller(self) -> dict[str, Any] | None:
        """The controller of a controller-mode cluster (address, pid,
        running or not, its settings), None in classic mode."""
        with self._locked():
            state = self._load()
        c = state.get("controller")
        if c is None:
            return None
        ps = self._children.state(_pid(c))
        return {"address": c["address"], "state": "stopped" if ps == "gone" else ps,
                "pid": c["pid"] if ps != "gone" else None, "starts": c["starts"],
                "state_dir": self._path("controller"), "log": self._path("controller.log"),
                **c["settings"]}

    def _start_proxy(self, state: dict[str, Any], name: str) -> None:
        self._start_proxies(state, [name])

    def _start_proxies(self, state: dict[str, Any], keys: list[str]) -> None:
        """Start the link proxies `keys` (of state["proxies"]: a slave's
        name, or FROM.TO in controller mode) at once, and wait until each
        has written its state file (it listens)."""
        started = []
        for key in keys:
            p = state["proxies"][key]
            state_file = self._path("proxies", f"{key}.json")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(state_file)
            cmd = [self.python, "-m", "cluster.backends.proxy", "--listen",
                   f"{HOST}:{p['port']}", "--target", p["target"], "--state-file", state_file]
            if p["cut"]:
                cmd.append("--cut")
            proc = self._children.spawn(cmd, log_path=self._path("proxies", f"{key}.log"),
                                        env=node_env())
            p["pid"], p["start_time"] = proc.pid, proc.start_time
            started.append((key, proc, state_file))
        # Python's start on a loaded machine: a second or more each, in parallel.
        deadline = time.monotonic() + 15 + len(keys)
        for key, proc, state_file in started:
            while not os.path.exists(state_file):
                if self._children.state(proc) == "gone":
                    raise BackendError(f"link proxy {key} exited at start: "
                                       f"{_tail(self._path('proxies', f'{key}.log'))}")
                if time.monotonic() > deadline:
                    raise BackendError(f"link proxy {key} did not start in time; see "
                                       f"{self._path('proxies', f'{key}.log')}")
                time.sleep(0.01)

    def _spawn_node(self, state: dict[str, Any], name: str) -> None:
        n = state["nodes"][name]
        proxy = state["proxies"].get(name)
        if (proxy is not None and proxy["pid"] is not None
                and self._children.state(_pid(proxy)) == "gone"):
            self._start_proxy(state, name)  # someone ended it: the link comes back as it was
        controller = state["controller"]["address"] if state.get("controller") else None
        if controller is not None:  # this node's links, and the others' to it, likewise
            self._start_proxies(state, [
                k for k, p in state["proxies"].items() if name in (p["from"], p["to"])
                and p["pid"] is not None and self._children.state(_pid(p)) == "gone"])
        self._power_cut(state, name)  # it died since (a crash failpoint), or was killed
        ns = dataclasses.replace(spec_from_dict(n["spec"]), failpoints=n["failpoints"])
        # A master repairs from its slaves (a slave from its master, by default).
        peers = tuple(v["address"] for k, v in state["nodes"].items()
                      if k != name and v.get("master_via")) if not n["master_via"] else ()
        # A master is told its slaves' names: its HA stream limit counts them.
        slaves = tuple(k for k, v in state["nodes"].items()
                       if k != name and v.get("master_via")) if not n["master_via"] else ()
        peer_addresses: tuple[tuple[str, str], ...] = ()
        if controller is not None:
            # Any node may be elected: every other is its peer, reached (as
            # the controller is) through this node's link proxy to it.
            controller, peer_addresses = controller_links.node_routes(state, name, HOST)
            peers = tuple(address for _, address in peer_addresses)
            slaves = tuple(k for k in state["nodes"] if k != name)
        refusal = self._path("nodes", name, REFUSAL_FILE)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(refusal)  # this start says anew
        args = ns.node_args(data_dir=self._path("nodes", name, "data"),
                            listen=n["address"], master=n["master_via"],
                            token_file=self._path("token"), refusal_file=refusal,
                            repair_from=peers, slaves=slaves, controller=controller,
                            peer_addresses=peer_addresses)
        log_path = self._path("nodes", name, "node.log")
        with open(append_no_link(log_path), "ab") as f:
            f.write(f"---- {time.strftime('%Y-%m-%d %H:%M:%S')} dlab cluster: starting {name} "
                    f"(start {n['starts'] + 1})\n".encode())
        proc = self._children.spawn([self.python, "-m", "cluster.cli", "node", *args],
                                    log_path=log_path, env=node_env())
        n["pid"], n["start_time"] = proc.pid, proc.start_time
        n["starts"] += 1
        n["paused"] = False

    def _wait_healthy(self, state: dict[str, Any], name: str, deadline: float) -> None:
        n = state["nodes"][name]
        proc = _pid(n)
        log_path = self._path("nodes", name, "node.log")
        self._wait_serving(
            name, n["address"], deadline, see=log_path,
            exit_output=lambda: (f"its log says: {_tail(log_path)}"
                                 if self._children.state(proc) == "gone" else None))

    # --------------------------------------------------------------- query
    def _info(self, state: dict[str, Any], name: str) -> NodeInfo:
        n = state["nodes"][name]
        ns = spec_from_dict(n["spec"])
        ps = self._children.state(_pid(n))
        node_state = {"running": NodeState.RUNNING, "paused": NodeState.PAUSED}.get(
            ps, NodeState.STOPPED)
        extra: dict[str, Any] = {"port": n["port"], "starts": n["starts"],
                                 "failpoints": n["failpoints"]}
        refused = (read_refusal(self._path("nodes", name, REFUSAL_FILE))
                   if node_state == NodeState.STOPPED else None)
        if refused:
            node_state, extra["refused"] = NodeState.REFUSED, refused
        node_state = self._lost_state(state, name, node_state, extra)
        if state.get("controller"):
            cut = controller_links.cut_from(state, name)
            extra["partitioned"] = bool(cut)
            extra["cut_from"] = cut
        elif name in state["proxies"]:
            p = state["proxies"][name]
            extra["master_via"] = n["master_via"]
            extra["partitioned"] = bool(p["cut"])
            extra["proxy_pid"] = p["pid"]
        return NodeInfo(
            name=name, role=ns.role, address=n["address"], state=node_state,
            data_dir=self._path("nodes", name, "data"),
            log_path=self._path("nodes", name, "node.log"),
            pid=n["pid"] if node_state in (NodeState.RUNNING, NodeState.PAUSED) else None,
            extra=extra,
        )

    # -------------------------------------------------------------- faults
    def kill(self, name: str) -> None:
        with self._locked():
            state = self._load()
            proc = self._running(state, name, "kill")
            self._children.signal(proc, signal.SIGKILL)
            if not self._children.wait_state(proc, {"gone"}, 10):
                raise BackendError(f"node {name} (pid {proc.pid}) did not die after SIGKILL")
            self._power_cut(state, name)

    def stop(self, name: str) -> None:
        with self._locked():
            state = self._load()
            proc = self._running(state, name, "stop")
            self._stop_proc(name, proc)

    def _stop_proc(self, name: str, proc: ProcId | None) -> None:
        self._children.signal(proc, signal.SIGTERM)
        self._children.signal(proc, signal.SIGCONT)  # a paused node must run to shut down
        if not self._children.wait_state(proc, {"gone"}, STOP_TIMEOUT_S):
            self._children.signal(proc, signal.SIGKILL)
            self._children.wait_state(proc, {"gone"}, 10)
            raise BackendError(f"node {name} did not shut down within {STOP_TIMEOUT_S:g} s "
                               "of SIGTERM and was killed")

    def start(self, name: str, *, timeout_s: float = 60.0) -> NodeInfo:
        with self._locked():
            state = self._load()
            check_name(state, name)
            if self._children.state(_pid(state["nodes"][name])) != "gone":
                raise BackendError(f"node {name} is already running; stop or kill it first")
            refuse_lost(state, name)
            self._spawn_node(state, name)
            self._save(state)
            self._wait_healthy(state, name, time.monotonic() + timeout_s)
            return self._info(state, name)

    def restart(self, name: str, *, timeout_s: float = 60.0) -> NodeInfo:
        with self._locked():
            state = self._load()
            check_name(state, name)
            refuse_lost(state, name)
            proc = _pid(state["nodes"][name])
            if self._children.state(proc) != "gone":
                self._stop_proc(name, proc)
            self._spawn_node(state, name)
            self._save(state)
            self._wait_healthy(state, name, time.monotonic() + timeout_s)
            return self._info(state, name)

    def pause(self, name: str) -> None:
        with self._locked():
            state = self._load()
            proc = self._running(state, name, "pause")
            self._children.signal(proc, signal.SIGSTOP)
            if not self._children.wait_state(proc, {"paused", "gone"}, 10):
                raise BackendError(f"node {name} did not stop after SIGSTOP")

    def resume(self, name: str) -> None:
        with self._locked():
            state = self._load()
            check_name(state, name)
            proc = _pid(state["nodes"][name])
            if self._children.state(proc) == "gone":
                raise BackendError(f"node {name} is not running; use start")
            self._children.signal(proc, signal.SIGCONT)
            if not self._children.wait_state(proc, {"running", "gone"}, 10):
                raise BackendError(f"node {name} did not continue after SIGCONT")

    def _links(self, state: dict[str, Any], a: str, b: str) -> list[str]:
        """The link proxies a partition of a and b cuts: classic, the
        slave's (the link runs between the master and each slave);
        controller mode, both directions of the pair, or the node's link to
        the controller (cluster/backends/controller_links.py)."""
        if state.get("controller"):
            return controller_links.links_between(state, a, b)
        check_name(state, a)
        check_name(state, b)
        master = state["master"]
        if master not in (a, b) or a == b:
            raise BackendError(f"no replication link between {a} and {b}: links run between "
                               f"the master ({master}) and each slave")
        return [b if a == master else a]

    def partition(self, a: str, b: str) -> None:
        self._set_cut(a, b, True)

    def heal(self, a: str, b: str) -> None:
        self._set_cut(a, b, False)

    def _set_cut(self, a: str, b: str, cut: bool) -> None:
        with self._locked():
            state = self._load()
            keys = self._links(state, a, b)
            for key in keys:  # signalled together, confirmed below
                if not self._children.signal(_pid(state["proxies"][key]),
                                             signal.SIGUSR1 if cut else signal.SIGUSR2):
                    raise BackendError(f"the link proxy of {key} is not running; restart the "
                                       "cluster (down, up)")
            deadline = time.monotonic() + 10
            for key in keys:
                state_file = self._path("proxies", f"{key}.json")
                while _read_json(state_file).get("cut") is not cut:
                    if time.monotonic() > deadline:
                        raise BackendError(f"the link proxy of {key} did not confirm the "
                                           f"{'cut' if cut else 'heal'}")
                    time.sleep(0.005)
                state["proxies"][key]["cut"] = cut
            self._save(state)

    # ------------------------------------------------------------ failover
    # promote, lose, rejoin: cluster/backends/failover_steps.py, with these
    # steps. A follower reaches the new master through its link proxy, now
    # leading there; its HA client reconnects through it.
    def _plan_promotion(self, state: dict[str, Any], name: str, *, running: set[str],
                        now_ms: int, role: Role | None, flush: FlushMode | None,
                        cut_off: frozenset[str]) -> Promotion:
        return plan_promote(state, name, running=running, now_ms=now_ms,
                            free_port=lambda: free_ports(1)[0], role=role, flush=flush,
                            cut_off=cut_off)

    def _cut_off_from(self, state: dict[str, Any], name: str) -> frozenset[str]:
        # A slave reaches its master through its link proxy; a cut proxy
        # partitions the two (partition() cuts the slave's).
        proxy = state["proxies"].get(name)
        return frozenset({state["master"]}) if proxy is not None and proxy["cut"] \
            else frozenset()

    def _switch_roles(self, state: dict[str, Any], plan: Promotion, name: str) -> None:
        for n in plan.restart:
            self._stop_proc(n, _pid(state["nodes"][n]))
        if plan.dropped_proxy is not None:
            self._end_proxy(name, plan.dropped_proxy)
        for n in plan.retarget:
            self._restart_proxy(state, n)
        for n in plan.restart:  # the new master first
            self._spawn_node(state, n)

    def _kill_for_loss(self, state: dict[str, Any], name: str) -> None:
        proc = _pid(state["nodes"][name])
        if self._children.signal(proc, signal.SIGKILL) and \
                not self._children.wait_state(proc, {"gone"}, 10):
            raise BackendError(f"node {name} (pid {proc.pid if proc else '?'}) did not die "
                               "after SIGKILL; nothing was moved")

    def _start_as_slave(self, state: dict[str, Any], name: str, deadline: float) -> None:
        master_address = route_of(state).address
        assert master_address is not None, "decide_rejoin refuses a cluster with no master"
        new_proxy = follow_through_proxy(state, name, master_address,
                                         lambda: free_ports(1)[0])
        self._save(state)
        if new_proxy or self._children.state(_pid(state["proxies"][name])) == "gone":
            self._restart_proxy(state, name)
        self._spawn_node(state, name)
        self._save(state)
        self._wait_healthy(state, name, deadline)

    def _start_node(self, state: dict[str, Any], name: str, deadline: float) -> None:
        self._spawn_node(state, name)
        self._save(state)
        self._wait_healthy(state, name, deadline)

    def _running_names(self, state: dict[str, Any]) -> set[str]:
        return {n for n, v in state["nodes"].items() if self._children.state(_pid(v)) != "gone"}

    def _end_proxy(self, name: str, entry: dict[str, Any]) -> None:
        """End the link proxy of slave `name` whose state entry is `entry`
        (SIGTERM, SIGKILL after 10 s) and remove its state file."""
        proc = _pid(entry)
        self._children.signal(proc, signal.SIGTERM)
        if not self._children.wait_state(proc, {"gone"}, 10):
            self._children.signal(proc, signal.SIGKILL)
            self._children.wait_state(proc, {"gone"}, 10)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path("proxies", f"{name}.json"))

    def _restart_proxy(self, state: dict[str, Any], name: str) -> None:
        """Slave `name`'s link proxy anew, to its (new) target: the slave's
        open stream ends with the old proxy and reconnects through this one."""
        self._end_proxy(name, state["proxies"][name])
        self._start_proxy(state, name)

    # ---------------------------------------------------------------- down
    def down(self) -> None:
        with self._locked():
            state = self._load()
            self._down_locked(state)

    def _down_locked(self, state: dict[str, Any]) -> None:
        errors = []
        for name, n in reversed(list(state["nodes"].items())):
            proc = _pid(n)
            if self._children.state(proc) != "gone":
                try:
                    self._stop_proc(name, proc)
                except BackendError as exc:
                    errors.append(str(exc))
            self._power_cut(state, name)  # one that had died, or would not stop
        for name, p in state["proxies"].items():
            self._end_proxy(name, p)
        c = state.get("controller")
        if c is not None and self._children.state(_pid(c)) != "gone":
            try:
                self._stop_proc("the controller", _pid(c))
            except BackendError as exc:
                errors.append(str(exc))
        for f in (STATE_FILE, ROUTE_FILE, "token"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(f))
        if errors:
            raise BackendError("; ".join(errors))

    # ------------------------------------------------------------- helpers
    def _running(self, state: dict[str, Any], name: str, what: str) -> ProcId:
        check_name(state, name)
        proc = _pid(state["nodes"][name])
        if self._children.state(proc) == "gone":
            raise BackendError(f"cannot {what} {name}: it is not running "
                               f"(start it with `dlab cluster start {name}`)")
        assert proc is not None
        return proc


def _pid(entry: dict[str, Any]) -> ProcId | None:
    if entry.get("pid") is None:
        return None
    return ProcId(int(entry["pid"]), int(entry["start_time"]))


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            data: dict[str, Any] = json.load(f)
            return data
    except (OSError, ValueError):
        return {}


def _tail(path: str, n: int = 5) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = f.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(lines[-n:]) or "(empty log)"


# glibc hands buffers above its mmap threshold back to the OS on free, so a
# node receiving 1 MiB HA ranges would page-fault every range's buffers in
# anew (measured: ~25% of a slave's catch-up time). Keep big buffers in the
# heap instead. Pure tuning: no effect on what is stored or acknowledged.
MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(64 * 1024 * 1024),
    "MALLOC_TRIM_THRESHOLD_": str(512 * 1024 * 1024),
    "MALLOC_TOP_PAD_": str(64 * 1024 * 1024),
}


def node_env() -> dict[str, str]:
    """The environment node (and proxy) processes run with."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("DLAB_FAILPOINTS", None)  # failpoints come from the node spec only
    for k, v in MALLOC_ENV.items():
        env.setdefault(k, v)
    return env
