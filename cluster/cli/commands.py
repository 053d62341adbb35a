"""The node, client, cluster and controller commands (`dlab node`, `dlab
send`, `dlab consume`, `dlab cluster ...`, `dlab controller ...`),
registered together."""

from __future__ import annotations

from typing import Any

from cluster.cli.client_commands import register_consume, register_send
from cluster.cli.cluster_commands import register_cluster
from cluster.cli.controller_command import register_controller
from cluster.cli.node_command import register_node


def register(sub: Any, bench_sub: Any) -> None:
    register_node(sub)
    register_send(sub)
    register_consume(sub)
    register_cluster(sub)
    register_controller(sub)
