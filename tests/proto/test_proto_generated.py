"""The committed generated modules in proto/ are what proto/generate.py makes
from the .proto sources now (edit a .proto, re-run `python -m proto.generate`)."""

from __future__ import annotations

import os

from proto import generate


def test_generated_modules_are_current(tmp_path: str) -> None:
    written = generate.generate(str(tmp_path))
    assert len(written) == len(generate.generated_names())
    stale = []
    for path in written:
        name = os.path.basename(path)
        committed = os.path.join(generate.PROTO_DIR, name)
        with open(path, "rb") as f:
            fresh = f.read()
        if not os.path.exists(committed):
            stale.append(f"{name} (missing)")
            continue
        with open(committed, "rb") as f:
            if f.read() != fresh:
                stale.append(name)
    assert not stale, ("generated modules are stale: " + ", ".join(stale)
                       + "; run `python -m proto.generate`")


def test_the_services_are_what_nodes_register() -> None:
    from proto import broker_pb2, ha_pb2

    broker = broker_pb2.DESCRIPTOR.services_by_name["Broker"]
    assert [m.name for m in broker.methods] == ["Send", "SendStream", "SendBatch", "Read", "Status",
                                               "Pull", "QueueInfo", "CommitOffset", "QueryOffset",
                                               "GetConsumerOffsets"]
    ha = ha_pb2.DESCRIPTOR.services_by_name["HA"]
    (replicate,) = ha.methods
    assert replicate.client_streaming and replicate.server_streaming


def test_the_controller_service_has_rocketmqs_controller_calls() -> None:
    from proto import controller_pb2

    controller = controller_pb2.DESCRIPTOR.services_by_name["Controller"]
    assert [m.name for m in controller.methods] == [
        "RegisterBroker", "Heartbeat", "ElectMaster", "GetReplicaInfo", "AlterSyncStateSet",
        "GetMetadata"]
    assert not any(m.client_streaming or m.server_streaming for m in controller.methods)
