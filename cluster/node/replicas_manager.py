"""A controller-mode broker's side of the controller (RocketMQ 5's
ReplicasManager): register, heartbeat, ask for an election when there is
no master, take the role the controller's answer gives, and, as master,
keep the SyncStateSet: shrink it by the members that fell behind, expand
it by the slaves that caught up (docs/design.md, "Controller mode: the
broker side").

One task per node (it dies with the node: a kill cancels it). Every
`controller_heartbeat_ms`:
1. Heartbeat (epoch: the last in the epoch file; max offset; confirmed
   offset; priority; address). The reply carries the controller's view: the
   master, its epoch and address, the SyncStateSet and its epoch.
2. No master: ask for an election (the requester is elected only on a
   broker set that never had a master, else the controller elects from the
   SyncStateSet: ha/controller/elect.py). Named master while this process
   does not serve as one (a restart quicker than the heartbeat timeout):
   ask too, and the controller elects it again in a new epoch.
3. The view names this broker master in an epoch it does not serve:
   become master (Node.become_master). It names another: follow it
   (Node.become_slave: the rejoin handshake and truncation first). A
   controller that cannot be reached changes nothing: a master stays a
   master, as RocketMQ's does (the isolated master of the chaos scenarios).
4. As master: every `sync_state_set_check_ms`, shrink the set by members
   with no stream or not caught up for `max_time_slave_not_catchup_ms`; at
   every ack (HAMaster.on_ack) and every round, expand it by a connected
   slave whose ack reached the confirmed offset and the current epoch's
   start. Each
   change is an AlterSyncStateSet fenced by both epochs; the master adopts
   the set the controller answers with, never its own proposal.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import grpc

from ha.credentials import token_metadata
from proto import controller_pb2
from store.emulate import RMQ_5663

if TYPE_CHECKING:
    from cluster.node.server import Node

log = logging.getLogger("dlab.node.controller")

CALL_TIMEOUT_S = 3.0


class ReplicasManager:
    def __init__(self, node: Node, stub: Any) -> None:
        self.node = node
        self.stub = stub
        self.metadata = token_metadata(node.config.token)
        self.broker_id = 0
        # Broker ids to names, from the controller's metadata (the
        # SyncStateSet comes as ids; the HA streams know slaves by name).
        self.names: dict[int, str] = {}
        self.info = controller_pb2.ReplicaInfo()
        self._last_check = 0.0
        self.interval_s = node.config.ha.controller_heartbeat_ms / 1000
        # One SyncStateSet change on its way at a time.
        self._changing = asyncio.Lock()
        self._expansion: asyncio.Task[None] | None = None
        # A change sent with no answer: the controller's view decides next.
        self._unconfirmed = False

    def on_ack(self, slave: str, acked: int) -> None:
        """HAMaster's hook after every accepted report: a slave not in the
        SyncStateSet whose ack reached the confirmed offset and the epoch's
        start joins it now (AutoSwitchHAConnection.maybeExpandInSyncStateSet
        checks on every ack), not at the next round."""
        node = self.node
        if (slave in node.sync_state_set or node.ha_master is None or not self.broker_id
                or self.info.master_id != self.broker_id
                or (self._expansion is not None and not self._expansion.done())):
            return
        if acked >= self._join_offset():
            self._expansion = asyncio.get_running_loop().create_task(self._expand())

    def _join_offset(self) -> int:
        """What a slave's ack must reach to join: the confirmed offset and
        the current epoch's start."""
        store, epochs = self.node.store, self.node.epochs
        assert store is not None and epochs is not None
        last = epochs.epochs.last
        return max(store.confirmed_offset(), last.start_offset if last else 0)

    async def _expand(self) -> None:
        try:
            await self._keep_sync_state_set(shrink=False)
        except grpc.RpcError as exc:
            log.info("SyncStateSet expansion not sent: %s (%s)", exc.code(), exc.details())

    async def _call(self, method: str, request: Any) -> Any:
        return await getattr(self.stub, method)(request, metadata=self.metadata,
                                                timeout=CALL_TIMEOUT_S)

    async def run(self) -> None:
        while True:
            try:
                await self.round()
            except grpc.RpcError as exc:
                log.info("controller %s: %s (%s); keeping the role",
                         self.node.config.controller, exc.code(), exc.details())
            await asyncio.sleep(self.interval_s)

    async def round(self) -> None:
        """Steps 1-4 of the module docstring, once."""
        node = self.node
        if not self.broker_id:
            reply = await self._call("RegisterBroker", controller_pb2.RegisterBrokerRequest(
                name=node.config.name))
            self.broker_id = reply.broker_id
            log.info("registered with the controller as broker %d", self.broker_id)
        reply = await self._call("Heartbeat", self._heartbeat())
        if reply.outcome == "refused":
            if reply.refusal == "not_registered":  # a controller that lost its state
                self.broker_id = 0
            log.warning("controller refused the heartbeat: %s", reply.reason)
            return
        info = reply.replica_info
        if info.master_id == 0 or self._restarted_master(info):
            # No master; or this broker named master of an epoch it served
            # before this process started: a restart the controller has
            # not noticed. It asks again, and serves a new epoch.
            reply = await self._call("ElectMaster", controller_pb2.ElectMasterRequest(
                requester=self.broker_id))
            info = reply.replica_info
        await self._apply(info)
        if (node.ha_master is not None and info.master_id == self.broker_id
                and not self._changing.locked()):  # a change on its way: next round
            await self._keep_sync_state_set()

    def _restarted_master(self, info: controller_pb2.ReplicaInfo) -> bool:
        """Named master in an epoch this broker's epoch file already holds
        as its last, while this process does not serve as master: it
        served that epoch in an earlier process (a freshly elected broker's
        last epoch is an older one)."""
        node = self.node
        assert node.epochs is not None
        last = node.epochs.epochs.last
        return (info.master_id == self.broker_id and node.ha_master is None
                and last is not None and last.epoch == info.master_epoch)

    def _heartbeat(self) -> controller_pb2.HeartbeatRequest:
        node = self.node
        store = node.store
        assert store is not None and node.epochs is not None
        last = node.epochs.epochs.last
        return controller_pb2.HeartbeatRequest(
            broker_id=self.broker_id, epoch=0 if last is None else last.epoch,
            max_offset=store.log.wrote, confirmed_offset=store.confirmed_offset(),
            priority=node.config.priority, address=node.config.advertised)

    async def _apply(self, info: controller_pb2.ReplicaInfo) -> None:
        node = self.node
        self.info = info
        if info.master_id == 0:
            return
        if info.master_id == self.broker_id:
            if node.ha_master is None or node.master_epoch != info.master_epoch:
                await node.become_master(info.master_epoch,
                                         await self._set_names(info.sync_state_set))
            elif not self._changing.locked():  # a change on its way: its answer decides
                names = await self._set_names(info.sync_state_set)
                if self._unconfirmed or node.sync_state_set != names:
                    node.set_sync_state_set(names)
                    self._unconfirmed = False
            return
        if not info.master_address:
            return  # the master has not heartbeaten to this controller yet
        # The address the master advertises, or this node's way to it
        # (--peer-address: the local backend's link proxy).
        address = node.config.peer_address(info.master_name, info.master_address)
        if node.following != address or node.master_epoch != info.master_epoch:
            why = await node.become_slave(address, info.master_epoch)
            if why is not None:
                log.info("not following %s (%s) yet: %s", info.master_name, address, why)

    async def _refresh_names(self) -> None:
        """Broker ids to names, from the controller's metadata."""
        meta = await self._call("GetMetadata", controller_pb2.GetMetadataRequest())
        self.names.update({m.broker_id: m.name for m in meta.members})

    async def _set_names(self, ids: Any) -> frozenset[str]:
        if any(i not in self.names for i in ids):
            await self._refresh_names()
        return frozenset(self.names[i] for i in ids if i in self.names)

    async def _keep_sync_state_set(self, *, shrink: bool = True) -> None:
        """Step 4: propose a shrunk (unless `shrink` is False) or expanded
        set; adopt the answer. One change at a time."""
        async with self._changing:
            await self._change_sync_state_set(shrink)

    async def _change_sync_state_set(self, shrink: bool) -> None:
        node = self.node
        ha, store, epochs = node.ha_master, node.store, node.epochs
        assert ha is not None and store is not None and epochs is not None
        cfg = node.config.ha
        now = node.clock.monotonic()
        members = node.sync_state_set
        connected = {a.slave: a.acked for a in ha.acks()}
        check_due = shrink and now - self._last_check >= cfg.sync_state_set_check_ms / 1000
        keep = {node.config.name}
        for name in members - {node.config.name}:
            caught = ha.caught_up_at.get(name)
            behind_s = now - caught if caught is not None else float("inf")
            if not check_due or (name in connected
                                 and behind_s * 1000 < cfg.max_time_slave_not_catchup_ms):
                keep.add(name)
        join_at = self._join_offset()
        for name, acked in connected.items():
            if name not in members and acked >= join_at:
                keep.add(name)
        if check_due:
            self._last_check = now
        new = frozenset(keep)
        if new == members:
            return
        if any(n not in self.names.values() for n in new):
            await self._refresh_names()
        ids = {n: i for i, n in self.names.items()}
        # While the change is on its way, puts wait for the union of the
        # old and the new set (apache/rocketmq#5798's isSynchronizingSyncStateSet):
        # the controller may apply it and the master die before it hears,
        # and a new member elected must hold what was acknowledged.
        if RMQ_5663 not in node.config.ha.emulate:
            node.set_sync_state_set(members, synchronizing=new)
        try:
            reply = await self._call("AlterSyncStateSet", controller_pb2.AlterSyncStateSetRequest(
                master=self.broker_id, master_epoch=self.info.master_epoch,
                sync_state_set_epoch=self.info.sync_state_set_epoch,
                new_sync_state_set=sorted(ids[n] for n in new if n in ids)))
        except BaseException:
            # No answer: the controller may have applied it. The union stays
            # until a heartbeat's reply says which set the controller holds.
            self._unconfirmed = True
            raise
        if reply.outcome == "sync_state_set_changed":
            self.info = reply.replica_info
            await node.failpoints.hit_async("sync_state_set_adopt")
            node.set_sync_state_set(await self._set_names(reply.replica_info.sync_state_set))
            log.warning("SyncStateSet is now %s (epoch %d)", sorted(node.sync_state_set),
                        reply.replica_info.sync_state_set_epoch)
        else:
            node.set_sync_state_set(members)
            log.info("SyncStateSet change to %s not applied: %s %s", sorted(new),
                     reply.refusal or reply.outcome, reply.reason)
