"""A node's role: the vocabulary of the node (NodeConfig), the backends'
specs (NodeSpec) and the chaos harness, kept at the bottom of the cluster
layer so that each of them can import it."""

from __future__ import annotations

import enum


class Role(enum.StrEnum):
    SYNC_MASTER = "SYNC_MASTER"
    ASYNC_MASTER = "ASYNC_MASTER"
    SLAVE = "SLAVE"
