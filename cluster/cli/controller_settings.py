"""Controller mode's settings as command-line options, declared once for
every command that takes them: `dlab node` (the ack rules a master
applies), `dlab controller run` (the unclean election), `dlab cluster up`
and the chaos commands (both). The defaults are RocketMQ's: a put waits for
no slave (inSyncReplicas 1), any SyncStateSet is enough
(minInSyncReplicas 1), no unclean election."""

from __future__ import annotations

import argparse
from typing import Any

from store.tools.cli_args import positive_int

IN_SYNC_REPLICAS_DEFAULT = 1
MIN_IN_SYNC_REPLICAS_DEFAULT = 1


def add_ack_options(group: Any, *, unset: bool = False) -> None:
    """--all-ack-in-sync-state-set, --in-sync-replicas N,
    --min-in-sync-replicas N on `group` (a parser or an argument group).
    `unset`: N defaults to None instead of RocketMQ's 1, for a command that
    must tell an option given from one left out."""
    group.add_argument("--all-ack-in-sync-state-set", action="store_true",
                       help="a put waits for every SyncStateSet member's ack (RocketMQ's "
                       "allAckInSyncStateSet; default: no)")
    group.add_argument("--in-sync-replicas", type=positive_int, metavar="N",
                       default=None if unset else IN_SYNC_REPLICAS_DEFAULT,
                       help="without --all-ack-in-sync-state-set, a put waits for N copies, "
                       "the master's included (default 1: it waits for no slave)")
    group.add_argument("--min-in-sync-replicas", type=positive_int, metavar="N",
                       default=None if unset else MIN_IN_SYNC_REPLICAS_DEFAULT,
                       help="while the SyncStateSet is smaller than N, puts are refused with "
                       "IN_SYNC_REPLICAS_NOT_ENOUGH (default 1)")


def add_elect_unclean(group: Any) -> None:
    """--elect-unclean on `group`."""
    group.add_argument("--elect-unclean", action="store_true",
                       help="when no SyncStateSet member is alive, elect any replica "
                       "(RocketMQ's enableElectUncleanMaster: MAY LOSE acknowledged "
                       "messages; default: no)")


def ack_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The three ack options' values, RocketMQ's defaults where unset."""
    return {"all_ack_in_sync_state_set": args.all_ack_in_sync_state_set,
            "in_sync_replicas": args.in_sync_replicas or IN_SYNC_REPLICAS_DEFAULT,
            "min_in_sync_replicas": args.min_in_sync_replicas or MIN_IN_SYNC_REPLICAS_DEFAULT}
