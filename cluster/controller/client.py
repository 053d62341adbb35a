"""A client of the Controller service that sends the cluster token on every
call: `dlab controller status` and the tests use it (a broker's own side
will live with the node)."""

from __future__ import annotations

from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ha.credentials import token_metadata
from proto import controller_pb2, controller_pb2_grpc


class ControllerClient:
    """Blocking calls, each with a deadline of `timeout_s`."""

    def __init__(self, address: str, token: str, *, timeout_s: float = 5.0) -> None:
        self.address = address
        self.channel = grpc.insecure_channel(address)
        self.stub = controller_pb2_grpc.ControllerStub(self.channel)
        self.call_metadata = token_metadata(token)
        self.timeout_s = timeout_s

    def _call(self, method: str, request: Any) -> Any:
        return getattr(self.stub, method)(request, metadata=self.call_metadata,
                                          timeout=self.timeout_s)

    def register(self, name: str) -> controller_pb2.ControllerReply:
        return self._call("RegisterBroker", controller_pb2.RegisterBrokerRequest(name=name))

    def heartbeat(self, broker_id: int, *, epoch: int = 0, max_offset: int = 0,
                  confirmed_offset: int = 0, priority: int = 0,
                  address: str = "") -> controller_pb2.ControllerReply:
        return self._call("Heartbeat", controller_pb2.HeartbeatRequest(
            broker_id=broker_id, epoch=epoch, max_offset=max_offset,
            confirmed_offset=confirmed_offset, priority=priority, address=address))

    def elect_master(self, *, requester: int = 0,
                     preferred: int = 0) -> controller_pb2.ControllerReply:
        return self._call("ElectMaster", controller_pb2.ElectMasterRequest(
            requester=requester, preferred=preferred))

    def replica_info(self) -> controller_pb2.ControllerReply:
        return self._call("GetReplicaInfo", controller_pb2.GetReplicaInfoRequest())

    def alter_sync_state_set(self, *, master: int, master_epoch: int,
                             sync_state_set_epoch: int,
                             new_set: list[int]) -> controller_pb2.ControllerReply:
        return self._call("AlterSyncStateSet", controller_pb2.AlterSyncStateSetRequest(
            master=master, master_epoch=master_epoch,
            sync_state_set_epoch=sync_state_set_epoch, new_sync_state_set=new_set))

    def metadata(self) -> controller_pb2.Metadata:
        return self._call("GetMetadata", controller_pb2.GetMetadataRequest())

    def health(self) -> str:
        """The gRPC health status of the Controller service (no token needed)."""
        stub = health_pb2_grpc.HealthStub(self.channel)
        answer = stub.Check(health_pb2.HealthCheckRequest(
            service=controller_pb2.DESCRIPTOR.services_by_name["Controller"].full_name),
            timeout=self.timeout_s)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> ControllerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
