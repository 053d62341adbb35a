"""The compose backend: every node a container of the node image
(`dlab image build`), one master and N slaves in one compose project, driven
by `docker compose` or `docker-compose` for up/down and by the Docker SDK for
faults.

Layout of DIR (as cluster/backends/interface.py fixes it, plus `compose.yml`):
cluster.json, token (0600), compose.yml (generated; `docker-compose -f
DIR/compose.yml -p PROJECT ps` works on it by hand), nodes/NAME/data (the
store, bind-mounted) and nodes/NAME/node.log (the node's --log-file); in
controller mode also controller/ (the controller's state) and
controller.log, written by the controller's container (see "controller
mode" below).

Networks, so that cutting replication leaves the harness's view intact:
- `client`: every node's gRPC port is published on 127.0.0.1:HOSTPORT
  through it; the harness, `dlab send` and `status` use those addresses.
- `repl` (classic mode): the slaves reach the master as `repl-master:7000`,
  an alias that exists on this network only. `partition(master, slave)`
  disconnects the slave from `repl` (its established HA stream dies with the
  interface; a new one cannot resolve the master); `heal` connects it again.
- link networks (controller mode, where any node may follow any other): one
  per pair of nodes, `link.A.B`, on which each of the two is `peer.NAME`,
  and one per node with the controller, `ctl.NAME`, on which the controller
  is `controller.link`. A node reaches its peers and the controller by those
  aliases only (`--peer-address`, `--controller`), so `partition(A, B)`
  (disconnecting both from `link.A.B`) cuts that pair and nothing else, and
  `partition(A, controller)` cuts A's calls to the controller. A cluster of
  n nodes has n(n-1)/2 + n of them: the engine's default address pools hold
  about 30 networks, so a few controller-mode clusters at once fit.

Faults go through the Docker SDK: kill = SIGKILL to the node (PID 1 of its
container; the node's crash model decides what survives; under `power` the
harness then cuts the bind-mounted store to its durable mark, as the local
backend does: store/log/durable_mark.py), stop = SIGTERM with
a grace period, pause/resume = the cgroup freezer (`docker pause`). Torn tail
and bit flip need no backend: they edit the bind-mounted files of a stopped
node (chaos/harness/disk_faults.py), which the containers write as the host user.

Failpoints are part of a node's command line, so a container created with
other failpoints than the ones set now is recreated (through compose) at its
next start; a partition is re-applied to the new container.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
from typing import TYPE_CHECKING, Any

from cluster.backends.controller_mode import ControllerSteps, check_controller_spec
from cluster.backends.dir_files import replace_no_link, write_token
from cluster.backends.docker_engine import EngineUnavailableError, connect
from cluster.backends.failover import Promotion, decide_promote, refuse_lost
from cluster.backends.interface import (
    CONTROLLER_NAME,
    REFUSAL_FILE,
    BackendError,
    ClusterSpec,
    ControllerSpec,
    NodeInfo,
    NodeSpec,
    NodeState,
    read_refusal,
)
from cluster.backends.local import MALLOC_ENV, spec_from_dict, spec_to_dict
from cluster.backends.procs import free_ports
from cluster.backends.state_dir import (
    STATE_FILE,
    STATE_VERSION,
    NodeRefusedError,
    check_name,
)
from cluster.node.role import Role
from cluster.node.route import ROUTE_FILE
from store.config import FlushMode

if TYPE_CHECKING:
    import docker
    from docker.models.containers import Container

    from cluster.backends.image import CheckedImages

log = logging.getLogger("dlab.compose")

COMPOSE_FILE = "compose.yml"
NODE_PORT = 7000  # inside every container
MASTER_ALIAS = "repl-master"  # the master's name on the `repl` network only
STOP_TIMEOUT_S = 30
HOST = "127.0.0.1"
# Inside the container: the node's directory (data + log) and the token.
NODE_MOUNT = "/node"
TOKEN_MOUNT = "/run/dlab/token"
# Controller mode: the controller's service (and so its name on the
# cluster's networks, where nodes reach it) and its port inside its container;
# the cluster directory is bind-mounted at CLUSTER_MOUNT there (its state in
# controller/, its log controller.log, the route it publishes route.json).
CONTROLLER = CONTROLLER_NAME
CONTROLLER_PORT = 9876
CLUSTER_MOUNT = "/cluster"
# Controller mode: a node reaches a peer as `peer.NAME`, the peer's alias on
# the link network of the two, and the controller as CONTROLLER_ALIAS, its
# alias on the node's own link network to it (node names hold no dot, so no
# alias is a service name).
CONTROLLER_ALIAS = "controller.link"


def peer_alias(name: str) -> str:
    """Controller mode: node `name`'s alias on each of its link networks."""
    return f"peer.{name}"


def health_probe(port: int) -> str:
    """A container's health check: the gRPC health service of the node (or
    the controller) inside it, as the backend itself checks it from the
    host. Exit 0 only when SERVING."""
    return (
        "import sys, grpc; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; "
        f"c = grpc.insecure_channel('127.0.0.1:{port}'); "
        "r = g.HealthStub(c).Check(h.HealthCheckRequest(), timeout=2); "
        "sys.exit(0 if r.status == h.HealthCheckResponse.SERVING else 1)"
    )


# --- pure: the compose document ----------------------------------------------


def project_name(directory: str) -> str:
    """One compose project per cluster directory (names must be unique on
    the engine and lowercase)."""
    return "dlab-" + hashlib.sha256(os.path.abspath(directory).encode()).hexdigest()[:10]


def link_networks(nodes: list[str]) -> dict[str, tuple[str, str]]:
    """Controller mode: every link network of a cluster of `nodes` (by its
    key in the compose file) with the two containers on it: one per pair of
    nodes, one per node and the controller."""
    links = {link_network(a, b): (a, b) for i, a in enumerate(nodes) for b in nodes[i + 1:]}
    links.update({link_network(a, CONTROLLER): (a, CONTROLLER) for a in nodes})
    return links


def link_network(a: str, b: str) -> str:
    """The key of the link network between nodes a and b, or a node and the
    controller (CONTROLLER): `link.A.B` (a pair, in name order) or `ctl.A`."""
    if CONTROLLER in (a, b):
        return f"ctl.{b if a == CONTROLLER else a}"
    first, second = sorted((a, b))
    return f"link.{first}.{second}"


def _cut_links(state: dict[str, Any], name: str) -> list[str]:
    """Controller mode: the cut link networks node `name` is on."""
    links = link_networks(list(state["nodes"]))
    return [key for key in state.get("cuts", ()) if name in links[key]]


def cut_from(state: dict[str, Any], name: str) -> list[str]:
    """Controller mode: the nodes (and the controller) node `name` is cut
    from now."""
    links = link_networks(list(state["nodes"]))
    return sorted(next(m for m in links[key] if m != name) for key in _cut_links(state, name))


def _on_network(state: dict[str, Any], container: Container, key: str) -> bool:
    """Whether `container` (as fetched: its attrs are current) is on the
    network of the compose file's key `key`."""
    return f"{state['project']}-{key}" in container.attrs["NetworkSettings"]["Networks"]


def node_command(ns: NodeSpec, *, failpoints: str, repair_from: tuple[str, ...] = (),
                 slaves: tuple[str, ...] = (), controller: str | None = None,
                 advertise: str | None = None,
                 peer_addresses: tuple[tuple[str, str], ...] = ()) -> list[str]:
    """What the container runs after the image's `dlab` entrypoint. A
    classic slave follows `repl-master`; in controller mode (`controller`
    given) the node follows whom the controller names, reaching it at its
    `peer_addresses` entry, and gives the controller `advertise`, the
    address clients and the route name it by."""
    spec = dataclasses.replace(ns, failpoints=failpoints)
    master = f"{MASTER_ALIAS}:{NODE_PORT}" if ns.role == Role.SLAVE else None
    return ["node", *spec.node_args(data_dir=f"{NODE_MOUNT}/data",
                                    listen=f"0.0.0.0:{NODE_PORT}", master=master,
                                    token_file=TOKEN_MOUNT,
                                    refusal_file=f"{NODE_MOUNT}/{REFUSAL_FILE}",
                                    repair_from=repair_from, slaves=slaves,
                                    controller=controller, advertise=advertise,
                                    peer_addresses=peer_addresses),
            "--log-file", f"{NODE_MOUNT}/node.log"]


def controller_command(controller: dict[str, Any], nodes: dict[str, dict[str, Any]]
                       ) -> list[str]:
    """What the controller's container runs after `dlab`: its state and log
    in the bind-mounted cluster directory, the route published there, each
    node named in it at its published port on the host (clients run there;
    the nodes heartbeat with their service names, which only the cluster's
    networks resolve)."""
    settings = ControllerSpec(**controller["settings"])
    return ["controller", "run", "--dir", f"{CLUSTER_MOUNT}/controller",
            "--token-file", TOKEN_MOUNT, "--listen", f"0.0.0.0:{CONTROLLER_PORT}",
            "--publish-route", CLUSTER_MOUNT, *settings.args(),
            *(arg for name, n in nodes.items()
              for arg in ("--route-address", f"{name}={n['address']}")),
            "--log-file", f"{CLUSTER_MOUNT}/controller.log"]


def compose_document(*, project: str, directory: str, image: str, master: str,
                     nodes: dict[str, dict[str, Any]], user: str,
                     controller: dict[str, Any] | None = None) -> dict[str, Any]:
    """The compose file for one master and its slaves, and in controller
    mode (`controller`: cluster.json's entry) the controller. `nodes` is
    cluster.json's: per node its spec, host port and failpoints. JSON is
    YAML, so the document is written as JSON: no YAML library needed."""
    services: dict[str, Any] = {}
    for name, n in nodes.items():
        ns = spec_from_dict(n["spec"])
        if controller is not None:
            # Any node may be elected: every other is its peer to repair
            # from and a slave it counts in its HA stream limit, reached
            # through the link network of the two.
            peers = tuple((k, f"{peer_alias(k)}:{NODE_PORT}") for k in nodes if k != name)
            command = node_command(
                ns, failpoints=n["failpoints"],
                repair_from=tuple(address for _, address in peers),
                slaves=tuple(k for k in nodes if k != name),
                controller=f"{CONTROLLER_ALIAS}:{CONTROLLER_PORT}",
                advertise=f"{name}:{NODE_PORT}", peer_addresses=peers)
            networks: dict[str, Any] = {"client": {}}
            for key, members in link_networks(list(nodes)).items():
                if name in members:
                    networks[key] = ({} if CONTROLLER in members
                                     else {"aliases": [peer_alias(name)]})
        else:
            networks = {"client": {},
                        "repl": {"aliases": [MASTER_ALIAS]} if name == master else {}}
            command = node_command(
                ns, failpoints=n["failpoints"],
                # A master repairs from its slaves, by service name on the
                # replication network.
                repair_from=tuple(f"{k}:{NODE_PORT}" for k in nodes if k != master)
                if name == master else (),
                # and counts them in its HA stream limit (ha/config.py).
                slaves=tuple(k for k in nodes if k != master) if name == master else ())
        services[name] = {
            **_container_basics(project, name, image, user),
            "command": command,
            "environment": {"PYTHONUNBUFFERED": "1", **MALLOC_ENV},
            "volumes": [
                {"type": "bind", "source": os.path.join(directory, "nodes", name),
                 "target": NODE_MOUNT},
                {"type": "bind", "source": os.path.join(directory, "token"),
                 "target": TOKEN_MOUNT, "read_only": True},
            ],
            "ports": [f"{HOST}:{n['port']}:{NODE_PORT}"],
            "networks": networks,
            "healthcheck": {"test": ["CMD", "python3", "-c", health_probe(NODE_PORT)],
                            "interval": "2s", "timeout": "5s", "retries": 3},
            "labels": {"durability-lab.node": name, "durability-lab.cluster-dir": directory},
        }
    if controller is not None:
        services[CONTROLLER] = {
            **_container_basics(project, CONTROLLER, image, user),
            "command": controller_command(controller, nodes),
            "environment": {"PYTHONUNBUFFERED": "1"},
            # Its state must outlive the container (a controller that forgot
            # its master epoch hands out epochs brokers have seen): on the
            # host, in DIR/controller, as the local backend keeps it.
            "volumes": [
                {"type": "bind", "source": directory, "target": CLUSTER_MOUNT},
                {"type": "bind", "source": os.path.join(directory, "token"),
                 "target": TOKEN_MOUNT, "read_only": True},
            ],
            "ports": [f"{HOST}:{controller['port']}:{CONTROLLER_PORT}"],
            "networks": {"client": {}, **{
                key: {"aliases": [CONTROLLER_ALIAS]}
                for key, members in link_networks(list(nodes)).items()
                if CONTROLLER in members}},
            "healthcheck": {"test": ["CMD", "python3", "-c", health_probe(CONTROLLER_PORT)],
                            "interval": "2s", "timeout": "5s", "retries": 3},
            "labels": {"durability-lab.controller": "1",
                       "durability-lab.cluster-dir": directory},
        }
    networks = {"client": {"name": f"{project}-client"}}
    if controller is None:
        networks["repl"] = {"name": f"{project}-repl"}
    else:
        networks.update({key: {"name": f"{project}-{key}"} for key in link_networks(list(nodes))})
    return {"services": services, "networks": networks}


def _container_basics(project: str, name: str, image: str, user: str) -> dict[str, Any]:
    """What every container of the cluster has alike."""
    return {
        "image": image,
        "container_name": f"{project}-{name}",
        "user": user,
        # docker-init is PID 1 and forwards SIGTERM: the process must not be
        # PID 1, which the kernel shields from its own SIGKILL (a crash failpoint).
        "init": True,
        "restart": "no",
        "stop_grace_period": f"{STOP_TIMEOUT_S}s",
    }


# --- compose CLI ------------------------------------------------------------------


def compose_command() -> list[str]:
    """`docker compose` (v2) where it works, else `docker-compose` (v1);
    DLAB_COMPOSE overrides, e.g. DLAB_COMPOSE=docker-compose."""
    override = os.environ.get("DLAB_COMPOSE")
    if override:
        return override.split()
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True,
                               check=False)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise BackendError("neither `docker compose` nor `docker-compose` is installed; install "
                       "one (e.g. the docker-compose package) to use --backend compose")


class ComposeBackend(ControllerSteps):
    name = "compose"

    def __init__(self, directory: str | None = None, *, image: str | None = None,
                 build_image: bool = True, images: CheckedImages | None = None) -> None:
        """`directory`: a cluster directory to attach to (a later `up` may
        also set it). `image`: the node image (default: what `dlab image
        build` makes). `build_image`: bring the image up to date with this
        checkout at `up` (a cache hit takes well under a second). `images`:
        the images already brought up to date by whoever runs this backend
        (a matrix shares one over its runs; default: this backend's own)."""
        from cluster.backends.image import NODE_IMAGE, CheckedImages

        self.directory = os.path.abspath(directory) if directory else None
        self.image = image or NODE_IMAGE
        self.build_image = build_image
        self._images = images if images is not None else CheckedImages()
        self._client: docker.DockerClient | None = None

    # ------------------------------------------------------------ plumbing
    def _docker(self) -> docker.DockerClient:
        if self._client is None:
            try:
                self._client = connect()
            except EngineUnavailableError as exc:
                raise BackendError(str(exc)) from None
        return self._client

    def _write_compose_file(self, state: dict[str, Any]) -> None:
        doc = compose_document(project=state["project"], directory=self._dir(),
                               image=state["image"], master=state["master"],
                               nodes=state["nodes"], user=state["user"],
                               controller=state.get("controller"))
        tmp = self._path(COMPOSE_FILE + ".tmp")
        with open(replace_no_link(tmp), "w") as f:
            f.write("# Generated by durability-lab's compose backend "
                    "(cluster/backends/compose.py).\n")
            json.dump(doc, f, indent=2)
            f.write("\n")
        os.replace(tmp, self._path(COMPOSE_FILE))

    def _compose(self, state: dict[str, Any], *args: str, timeout_s: float = 120) -> None:
        cmd = [*compose_command(), "--project-name", state["project"],
               "--file", self._path(COMPOSE_FILE), *args]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                                    cwd=self._dir(), check=False)
        except subprocess.TimeoutExpired:
            raise BackendError(f"`{' '.join(cmd[:2])} {' '.join(args)}` took longer than "
                               f"{timeout_s:g} s") from None
        if result.returncode != 0:
            tail = " | ".join((result.stderr or result.stdout).strip().splitlines()[-6:])
            hint = (" (the engine's address pools are used up by other networks: `dlab "
                    "cluster down` clusters you no longer need, or `docker network prune`)"
                    if "address pool" in tail else "")
            raise BackendError(f"`{' '.join(cmd[:2])} {' '.join(args)}` failed: {tail}{hint}")

    def _container(self, state: dict[str, Any], name: str) -> Container | None:
        from docker.errors import NotFound

        try:
            return self._docker().containers.get(f"{state['project']}-{name}")
        except NotFound:
            return None

    def _ensure_image(self) -> None:
        """Bring the node image up to date with this checkout, once per
        owner of `images` (cluster/backends/image.py CheckedImages): every
        run of a matrix then runs the same node code, even if the sources
        change while it runs, and pays for the check once."""
        from cluster.backends.image import ImageBuildError, build_node_image

        if self.image in self._images and self._image_present():
            return
        if self.build_image:
            try:
                built = build_node_image(tag=self.image, log=lambda line: log.info("%s", line))
            except ImageBuildError as exc:
                if not self._image_present():
                    raise BackendError(f"no node image {self.image}: {exc}") from None
                log.warning("using the existing %s: %s", self.image, exc)
            except EngineUnavailableError as exc:
                raise BackendError(str(exc)) from None
            else:
                log.info("node image %s (%d/%d steps from cache)", built.image_id,
                         built.steps_cached, built.steps)
        elif not self._image_present():
            raise BackendError(f"no node image {self.image}; build it with `dlab image build`")
        self._images.add(self.image)

    def _image_present(self) -> bool:
        from docker.errors import ImageNotFound

        try:
            self._docker().images.get(self.image)
        except ImageNotFound:
            return False
        return True

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
        if spec.controller_mode:
            check_controller_spec(spec)
            if CONTROLLER in names:
                raise BackendError(f"in controller mode no node may be called {CONTROLLER!r}: "
                                   "that is the controller's service")
        self._docker()
        self._ensure_image()
        with self._locked(create=True):
            project = project_name(self._dir())
            if os.path.exists(self._path(STATE_FILE)):
                old = self._load()
                alive = [n for n in [*old["nodes"], *([CONTROLLER] if old.get("controller")
                                                      else [])]
                         if self._container(old, n) is not None]
                if alive:
                    raise BackendError(
                        f"a cluster is already up in {self._dir()} ({', '.join(alive)}); run "
                        f"`dlab cluster down --dir {self._dir()}` first")
            write_token(self._path("token"), token)
            ports = free_ports(len(spec.nodes) + (1 if spec.controller_mode else 0))
            state: dict[str, Any] = {
                "version": STATE_VERSION, "backend": self.name, "master": spec.master.name,
                "project": project, "image": self.image, "compose": compose_command(),
                "user": f"{os.getuid()}:{os.getgid()}",
                "started_ms": time.time_ns() // 1_000_000, "nodes": {}, "proxies": {},
            }
            for port, ns in zip(ports[:len(spec.nodes)], spec.nodes, strict=True):
                os.makedirs(self._path("nodes", ns.name, "data"), exist_ok=True)
                state["nodes"][ns.name] = {
                    "spec": spec_to_dict(ns), "port": port, "address": f"{HOST}:{port}",
                    "failpoints": ns.failpoints, "created_failpoints": ns.failpoints,
                    "partitioned": False, "starts": 1,
                }
            if spec.controller_mode:
                ctl = spec.controller or ControllerSpec()
                state["controller"] = {"port": ports[-1], "address": f"{HOST}:{ports[-1]}",
                                       "starts": 0, "settings": dataclasses.asdict(ctl)}
                return self._up_controller_mode(state, spec, time.monotonic() + timeout_s)
            state["route"] = {"master": spec.master.name, "since_ms": state["started_ms"],
                              "epoch": 1}
            self._save(state)
            self._publish_route(state)
            self._write_compose_file(state)
            with self._coming_up(state):
                self._compose(state, "up", "--detach", "--no-build")
                deadline = time.monotonic() + timeout_s
                refusals: list[NodeRefusedError] = []
                for ns in spec.nodes:
                    try:
                        self._wait_healthy(state, ns.name, deadline)
                    except NodeRefusedError as exc:
                        refusals.append(exc)  # the others still serve: a repair needs them
                if refusals:
                    raise refusals[0]
                self._wait_replicating(state, deadline)
            return [self._info(state, n) for n in state["nodes"]]

    # ------------------------------------------------------ controller mode
    # One more container, `controller`, runs `dlab controller run` from the
    # node image (cluster/backends/controller_mode.py has the steps every
    # backend shares): the cluster directory bind-mounted, so its state
    # (DIR/controller) outlives the container and the route it publishes is
    # DIR/route.json on the host; its port published on 127.0.0.1 as the
    # nodes' are. The nodes reach it, and each other, by service name on the
    # cluster's networks (no `repl-master` alias: a slave follows whichever
    # node the controller names, at the address that node heartbeats with,
    # NAME:7000), while the route names each node's published port, where
    # clients on the host reach it (--route-address).
    def _up_controller_mode(self, state: dict[str, Any], spec: ClusterSpec,
                            deadline: float) -> list[NodeInfo]:
        os.makedirs(self._path("controller"), exist_ok=True)
        # A route left by an earlier cluster in DIR names its addresses.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(ROUTE_FILE))
        self._save(state)
        self._write_compose_file(state)
        with self._coming_up(state):
            self._compose(state, "up", "--detach", "--no-build", CONTROLLER)
            state["controller"]["starts"] += 1
            self._save(state)
            self._wait_controller_serving(state, deadline,
                                          exited=lambda: self._exit_output(state, CONTROLLER))
            # The first broker to ask is elected (a new broker set's first
            # master): the spec's master starts alone and asks first.
            self._compose(state, "up", "--detach", "--no-build", spec.master.name)
            self._wait_healthy(state, spec.master.name, deadline)
            self._wait_controller_master(state, deadline)
            if spec.slaves:
                self._compose(state, "up", "--detach", "--no-build",
                              *(ns.name for ns in spec.slaves))
                for ns in spec.slaves:
                    self._wait_healthy(state, ns.name, deadline)
            state["master"] = self._wait_route_master(deadline)
            self._save(state)
            self._wait_replicating(state, deadline)
        return [self._info(state, n) for n in state["nodes"]]

    def controller(self) -> dict[str, Any] | None:
        """The controller of a controller-mode cluster (address, container,
        running or not, its settings), None in classic mode."""
        with self._locked():
            state = self._load()
        c = state.get("controller")
        if c is None:
            return None
        container = self._container(state, CONTROLLER)
        status = container.status if container is not None else "gone"
        return {"address": c["address"],
                "state": status if status in ("running", "paused") else "stopped",
                "pid": None, "container": f"{state['project']}-{CONTROLLER}",
                "container_status": status, "starts": c["starts"],
                "state_dir": self._path("controller"), "log": self._path("controller.log"),
                **c["settings"]}

    def _start_node(self, state: dict[str, Any], name: str, deadline: float) -> None:
        self._start_locked(state, name, self._container(state, name),
                           max(0.0, deadline - time.monotonic()))

    def _exit_output(self, state: dict[str, Any], name: str) -> str | None:
        """None while container `name` runs; else the tail of its output."""
        container = self._container(state, name)
        if container is None or container.status in ("exited", "dead"):
            return f"its output: {self._logs_tail(container)}"
        return None

    def _wait_healthy(self, state: dict[str, Any], name: str, deadline: float) -> None:
        self._wait_serving(
            name, state["nodes"][name]["address"], deadline,
            exit_output=lambda: self._exit_output(state, name),
            see=f"{self._path('nodes', name, 'node.log')} and "
                f"`docker logs {state['project']}-{name}`")

    @staticmethod
    def _logs_tail(container: Container | None, n: int = 5) -> str:
        if container is None:
            return "(container gone)"
        with contextlib.suppress(Exception):
            container.reload()
            text = container.logs(tail=n).decode("utf-8", "replace").strip()
            return " | ".join(text.splitlines()) or "(no output)"
        return "(no output)"

    # --------------------------------------------------------------- query
    def _info(self, state: dict[str, Any], name: str) -> NodeInfo:
        n = state["nodes"][name]
        container = self._container(state, name)
        status = container.status if container is not None else "gone"
        node_state = {"running": NodeState.RUNNING, "paused": NodeState.PAUSED}.get(
            status, NodeState.STOPPED)
        extra: dict[str, Any] = {"port": n["port"], "starts": n["starts"],
                                 "failpoints": n["failpoints"], "container_status": status,
                                 "project": state["project"]}
        refused = (read_refusal(self._path("nodes", name, REFUSAL_FILE))
                   if node_state == NodeState.STOPPED else None)
        if refused:
            node_state, extra["refused"] = NodeState.REFUSED, refused
        node_state = self._lost_state(state, name, node_state, extra)
        if state.get("controller"):
            extra["cut_from"] = cut_from(state, name)
            extra["partitioned"] = bool(extra["cut_from"])
        elif name != state["master"]:
            extra["partitioned"] = bool(n["partitioned"])
        return NodeInfo(
            name=name, role=Role(n["spec"]["role"]), address=n["address"], state=node_state,
            data_dir=self._path("nodes", name, "data"),
            log_path=self._path("nodes", name, "node.log"),
            container=f"{state['project']}-{name}", extra=extra,
        )

    # -------------------------------------------------------------- faults
    def _running(self, state: dict[str, Any], name: str, what: str) -> Container:
        check_name(state, name)
        container = self._container(state, name)
        if container is None or container.status not in ("running", "paused"):
            raise BackendError(f"cannot {what} {name}: it is not running "
                               f"(start it with `dlab cluster start {name}`)")
        return container

    def kill(self, name: str) -> None:
        with self._locked():
            state = self._load()
            container = self._running(state, name, "kill")
            container.kill(signal="SIGKILL")
            self._wait_exited(container, name, 10)
            self._power_cut(state, name)  # the data dir is bind-mounted: same host page cache

    def _wait_exited(self, container: Container, name: str, timeout_s: float) -> int:
        from requests.exceptions import ConnectionError as RequestsConnectionError

        try:
            result = container.wait(timeout=timeout_s)
        except RequestsConnectionError:  # the SDK's read timeout
            raise BackendError(f"node {name} did not exit within {timeout_s:g} s") from None
        return int(result.get("StatusCode", -1))

    def stop(self, name: str) -> None:
        with self._locked():
            state = self._load()
            container = self._running(state, name, "stop")
            self._stop_container(container, name)

    def _stop_container(self, container: Container, name: str) -> None:
        if container.status == "paused":  # a frozen node must run to shut down
            container.unpause()
        container.stop(timeout=STOP_TIMEOUT_S)
        code = self._wait_exited(container, name, 10)
        if code == 137:
            what = "the controller" if name == CONTROLLER else f"node {name}"
            raise BackendError(f"{what} did not shut down within {STOP_TIMEOUT_S} s of "
                               "SIGTERM and was killed")

    def start(self, name: str, *, timeout_s: float = 60.0) -> NodeInfo:
        with self._locked():
            state = self._load()
            check_name(state, name)
            container = self._container(state, name)
            if container is not None and container.status in ("running", "paused"):
                raise BackendError(f"node {name} is already running; stop or kill it first")
            refuse_lost(state, name)
            self._start_locked(state, name, container, timeout_s)
            return self._info(state, name)

    def _start_locked(self, state: dict[str, Any], name: str, container: Container | None,
                      timeout_s: float) -> None:
        self._power_cut(state, name)  # it died since (a crash failpoint), or was killed
        n = state["nodes"][name]
        if container is not None and n["failpoints"] == n["created_failpoints"]:
            container.start()
            n["starts"] += 1
        else:  # new failpoints or role: a new command line, so a new container
            self._recreate(state, name)
        self._save(state)
        self._wait_healthy(state, name, time.monotonic() + timeout_s)

    def restart(self, name: str, *, timeout_s: float = 60.0) -> NodeInfo:
        with self._locked():
            state = self._load()
            check_name(state, name)
            refuse_lost(state, name)
            container = self._container(state, name)
            if container is not None and container.status in ("running", "paused"):
                self._stop_container(container, name)
            self._start_locked(state, name, self._container(state, name), timeout_s)
            return self._info(state, name)

    def pause(self, name: str) -> None:
        with self._locked():
            state = self._load()
            container = self._running(state, name, "pause")
            if container.status != "paused":
                container.pause()

    def resume(self, name: str) -> None:
        with self._locked():
            state = self._load()
            check_name(state, name)
            container = self._container(state, name)
            if container is None or container.status not in ("running", "paused"):
                raise BackendError(f"node {name} is not running; use start")
            if container.status == "paused":
                container.unpause()

    def _link(self, state: dict[str, Any], a: str, b: str) -> str:
        check_name(state, a)
        check_name(state, b)
        master = state["master"]
        if master not in (a, b) or a == b:
            raise BackendError(f"no replication link between {a} and {b}: links run between "
                               f"the master ({master}) and each slave")
        return b if a == master else a

    def partition(self, a: str, b: str) -> None:
        with self._locked():
            state = self._load()
            if state.get("controller"):
                self._set_controller_link(state, a, b, cut=True)
                return
            slave = self._link(state, a, b)
            if not state["nodes"][slave]["partitioned"]:
                self._set_link(state, slave, cut=True)
            state["nodes"][slave]["partitioned"] = True
            self._save(state)

    def heal(self, a: str, b: str) -> None:
        with self._locked():
            state = self._load()
            if state.get("controller"):
                self._set_controller_link(state, a, b, cut=False)
                return
            slave = self._link(state, a, b)
            # An old master a promotion left running is off the network too
            # (_leave_repl) though no link of it was cut.
            if state["nodes"][slave]["partitioned"] or (
                    self._is_running(state, slave) and not self._on_repl(state, slave)):
                self._set_link(state, slave, cut=False)
            state["nodes"][slave]["partitioned"] = False
            self._save(state)

    def _set_link(self, state: dict[str, Any], slave: str, *, cut: bool) -> None:
        container = self._container(state, slave)
        if container is None:
            raise BackendError(f"node {slave} has no container; restart the cluster")
        self._attach(state, container, "repl", [slave], attach=not cut,
                     what=f"the link of {slave}")

    def _attach(self, state: dict[str, Any], container: Container, key: str,
                aliases: list[str], *, attach: bool, what: str) -> None:
        """Connect `container` to network `key` of the compose file (with
        `aliases`) or disconnect it: a cut (or heal) of a link, a real
        network fault. An established connection through the network dies
        with the container's interface on it; a new one cannot resolve the
        peer's alias."""
        from docker.errors import APIError

        network = self._docker().networks.get(f"{state['project']}-{key}")
        try:
            if attach:
                network.connect(container, aliases=aliases)
            else:
                network.disconnect(container)
        except APIError as exc:
            raise BackendError(f"cannot {'heal' if attach else 'cut'} {what}: "
                               f"{exc.explanation or exc}") from None

    # Controller mode: any node may follow any other, so every pair of
    # nodes has a link network of its own, as has every node with the
    # controller (link_networks); a node reaches a peer by the peer's alias
    # there. A partition of two nodes takes both off the network of their
    # pair and nothing else: each keeps its links to a third node and to the
    # controller, as on local and the sim. A partition of a node and the
    # controller takes the node off its network to the controller. The
    # state's "cuts" holds each cut link's network key.
    def _set_controller_link(self, state: dict[str, Any], a: str, b: str, *,
                             cut: bool) -> None:
        if a == b:
            raise BackendError(f"no link between {a} and itself")
        for name in (a, b):
            if name != CONTROLLER:
                check_name(state, name)
        key = link_network(a, b)
        cuts: list[str] = state.setdefault("cuts", [])
        if (key in cuts) != cut:
            for name in (a, b):
                if name != CONTROLLER:
                    self._attach_link(state, name, key, attach=not cut)
        if cut and key not in cuts:
            cuts.append(key)
        elif not cut and key in cuts:
            cuts.remove(key)
        self._save(state)

    def _attach_link(self, state: dict[str, Any], name: str, key: str, *,
                     attach: bool) -> None:
        """Node `name` on (or off) link network `key`, running or not (a
        stopped container keeps its networks to its next start)."""
        container = self._container(state, name)
        if container is None:  # its next container is made with the cut applied
            return
        if _on_network(state, container, key) != attach:
            self._attach(state, container, key, [] if key.startswith("ctl.")
                         else [peer_alias(name)], attach=attach,
                         what=f"the link {key} of {name}")

    def _spec_changed(self, entry: dict[str, Any]) -> None:
        # A new command line: the next start recreates the container.
        entry["created_failpoints"] = None

    # ------------------------------------------------------------ failover
    # promote, lose, rejoin: cluster/backends/failover_steps.py, with these
    # steps. A slave's command line names the master as `repl-master`, an
    # alias on the replication network that the compose file gives the
    # master's service: a promotion recreates the new master's container
    # (and a running old master's) from a compose file that gives the alias
    # and a master's command line to the new master. A follower that keeps
    # running needs no restart: its stream to the old master ends, and its
    # HA client, which opens a new channel per stream (so resolves the alias
    # anew), reconnects to whichever container holds the alias now.
    def _running_names(self, state: dict[str, Any]) -> set[str]:
        return {n for n in state["nodes"] if self._is_running(state, n)}

    def _is_running(self, state: dict[str, Any], name: str) -> bool:
        container = self._container(state, name)
        return container is not None and container.status in ("running", "paused")

    def _cut_off_from(self, state: dict[str, Any], name: str) -> frozenset[str]:
        # partition() takes a slave off the replication network: cut off
        # from its master. An unknown name is refused here, before promote's
        # rules would (the state has no entry to read).
        check_name(state, name)
        return frozenset({state["master"]}) if state["nodes"][name].get("partitioned") \
            else frozenset()

    def _plan_promotion(self, state: dict[str, Any], name: str, *, running: set[str],
                        now_ms: int, role: Role | None, flush: FlushMode | None,
                        cut_off: frozenset[str]) -> Promotion:
        plan = decide_promote(state, name, running=running, now_ms=now_ms, role=role,
                              flush=flush, cut_off=cut_off)
        # The master's link is not cut: it is recreated on the replication
        # network with the alias. A follower's cut was of its link to the old
        # master; its link to the new one starts whole, as on local
        # (failover.follow_through_proxy): _switch_roles puts a running one
        # back on the network, a stopped one gets a new container (on it)
        # at its next start.
        for n in (name, *plan.followers):
            entry = state["nodes"][n]
            if entry["partitioned"] and n != name and n not in running:
                self._spec_changed(entry)
            entry["partitioned"] = False
        # A node whose role changed but does not restart now (an old master
        # that is down) gets a new container, with a slave's command line,
        # at its next start: the one it has would start it as a master.
        for n in (name, plan.old_master):
            self._spec_changed(state["nodes"][n])
        return plan

    def _switch_roles(self, state: dict[str, Any], plan: Promotion, name: str) -> None:
        # An old master left running (cut off) leaves the replication
        # network first, so that `repl-master` names the new master alone:
        # the followers' next streams must not resolve it to the old one.
        for n in plan.cut_off:
            self._leave_repl(state, n)
        for n in plan.restart:
            container = self._container(state, n)
            if container is not None and container.status in ("running", "paused"):
                self._stop_container(container, n)
        if plan.restart:
            self._recreate(state, *plan.restart)
        for n in plan.followers:  # a follower cut off the network rejoins it
            if n not in plan.cut_off and n not in plan.restart and self._is_running(state, n) \
                    and not self._on_repl(state, n):
                self._set_link(state, n, cut=False)

    def _on_repl(self, state: dict[str, Any], name: str) -> bool:
        container = self._container(state, name)
        return container is not None and _on_network(state, container, "repl")

    def _leave_repl(self, state: dict[str, Any], name: str) -> None:
        """Take running node `name` (an old master left running, cut off)
        off the replication network: `repl-master` then names the new
        master alone, and no stream a follower had with it can resume when
        the follower is back on the network. It is back on the network at
        a heal of its link or when its container is next created."""
        from docker.errors import APIError

        container = self._container(state, name)
        if container is None or not self._on_repl(state, name):
            return
        try:
            self._docker().networks.get(f"{state['project']}-repl").disconnect(container)
        except APIError as exc:
            raise BackendError(f"cannot take {name} off the replication network: "
                               f"{exc.explanation or exc}") from None

    def _recreate(self, state: dict[str, Any], *names: str) -> None:
        """New containers for `names` from the compose file as the state
        makes it now (their roles, the master's alias, failpoints), started;
        a partition of one is applied to its new container."""
        self._write_compose_file(state)
        self._compose(state, "up", "--detach", "--no-build", "--no-deps", "--force-recreate",
                      *names)
        for n in names:
            entry = state["nodes"][n]
            entry["created_failpoints"] = entry["failpoints"]
            entry["starts"] += 1
            if entry["partitioned"]:
                self._set_link(state, n, cut=True)
            for key in _cut_links(state, n):
                self._attach_link(state, n, key, attach=False)

    def _kill_for_loss(self, state: dict[str, Any], name: str) -> None:
        container = self._container(state, name)
        if container is not None and container.status in ("running", "paused"):
            container.kill(signal="SIGKILL")
            try:
                self._wait_exited(container, name, 10)
            except BackendError as exc:
                raise BackendError(f"{exc} after SIGKILL; nothing was moved") from None
        # Its replacement starts with a new container (rejoin).
        self._spec_changed(state["nodes"][name])

    def _start_as_slave(self, state: dict[str, Any], name: str, deadline: float) -> None:
        # A new container: the one the node has may carry a master's
        # command line (an old master) or have been killed as lost.
        self._spec_changed(state["nodes"][name])
        self._start_locked(state, name, self._container(state, name),
                           max(0.0, deadline - time.monotonic()))

    # ---------------------------------------------------------------- down
    def kill_controller(self) -> None:
        """Controller mode: SIGKILL the controller's container (its state
        file, on the host, is written durably before every answer, so it
        loses nothing it answered); no election happens until
        `start_controller`."""
        with self._locked():
            state = self._load()
            if not state.get("controller"):
                raise BackendError("this cluster runs no controller (classic mode)")
            container = self._container(state, CONTROLLER)
            if container is None or container.status not in ("running", "paused"):
                raise BackendError("cannot kill the controller: it is not running")
            container.kill(signal="SIGKILL")
            self._wait_exited(container, CONTROLLER, 10)

    def start_controller(self, *, timeout_s: float = 60.0) -> None:
        """Controller mode: start the controller's container again, on its
        state directory and address; returns once it serves. A restarted
        controller judges no broker alive or dead until it hears from it."""
        with self._locked():
            state = self._load()
            if not state.get("controller"):
                raise BackendError("this cluster runs no controller (classic mode)")
            container = self._container(state, CONTROLLER)
            if container is not None and container.status in ("running", "paused"):
                raise BackendError("the controller is already running")
            if container is None:
                self._write_compose_file(state)
                self._compose(state, "up", "--detach", "--no-build", "--no-deps", CONTROLLER)
            else:
                container.start()
            state["controller"]["starts"] += 1
            self._save(state)
            self._wait_controller_serving(state, time.monotonic() + timeout_s,
                                          exited=lambda: self._exit_output(state, CONTROLLER))

    def down(self) -> None:
        with self._locked():
            state = self._load()
            self._down_locked(state)

    def _down_locked(self, state: dict[str, Any]) -> None:
        """Clean stop of every node (SIGTERM), then compose removes the
        containers and networks; whatever compose left (it was interrupted,
        the file is gone) is removed through the SDK by the project label.
        Data dirs and logs stay."""
        errors: list[str] = []
        for name in reversed(list(state["nodes"])):
            container = self._container(state, name)
            if container is not None and container.status in ("running", "paused"):
                try:
                    self._stop_container(container, name)
                except BackendError as exc:
                    errors.append(str(exc))
            self._power_cut(state, name)  # one that had died, or would not stop
        container = self._container(state, CONTROLLER) if state.get("controller") else None
        if container is not None and container.status in ("running", "paused"):
            try:
                self._stop_container(container, CONTROLLER)
            except BackendError as exc:
                errors.append(str(exc))
        try:
            self._compose(state, "down", "--volumes", "--remove-orphans",
                          "--timeout", str(STOP_TIMEOUT_S))
        except BackendError as exc:
            errors.append(str(exc))
        self._remove_leftovers(state["project"])
        for f in (STATE_FILE, ROUTE_FILE, "token"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(f))
        if errors:
            raise BackendError("; ".join(errors))

    def _remove_leftovers(self, project: str) -> None:
        from docker.errors import APIError

        client = self._docker()
        label = f"com.docker.compose.project={project}"
        for container in client.containers.list(all=True, filters={"label": label}):
            with contextlib.suppress(APIError):
                container.remove(force=True, v=True)
        for network in client.networks.list(filters={"label": label}):
            with contextlib.suppress(APIError):
                network.remove()
        for volume in client.volumes.list(filters={"label": label}):
            with contextlib.suppress(APIError):
                volume.remove(force=True)

