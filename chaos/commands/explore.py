"""`dlab chaos explore`: every crash point of a small workload, every
target, every disk state a crash there may leave, on the sim backend
(chaos/explore/; docs/simulation.md, "Exhaustive exploration")."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from chaos.harness.run_config import FLUSHES, ROLES
from chaos.matrix.launch import results_dir
from ha.config import HAMode, ShipLimit, SlaveAheadPolicy
from store.emulate import EmulateError
from store.emulate import parse as parse_emulate
from store.tools.cli_args import UserError, positive_float, positive_int

EXPLORE_EXIT = """exit status: 0 when no explored state broke a promise; 1 when some did (each
is a case under OUT/cases/, replayed by `dlab chaos replay CASE`); 2 for bad
input."""
SLAVE_AHEAD_POLICIES = tuple(p.value for p in SlaveAheadPolicy)
SHIP_LIMITS = tuple(s.value for s in ShipLimit)
HA_MODES = tuple(m.value for m in HAMode)
SHOWN_PER_KIND = 5  # cases listed per kind of finding (explore.json has them all)


def event_list(text: str) -> tuple[int, ...]:
    """--events: crash point numbers and ranges, e.g. 3,10-14."""
    out: list[int] = []
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            a, _, b = part.partition("-")
            out += range(int(a), int(b or a) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give crash point numbers and ranges, e.g. 3,10-14") from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give crash point numbers from 0")
    return tuple(sorted(set(out)))


def cmd_explore(args: argparse.Namespace) -> int:
    from chaos.explore.explorer import KINDS, VIOLATION, ExploreError, explore
    from chaos.explore.workload import ExploreOptions

    try:
        emulate = tuple(sorted(parse_emulate(args.emulate)))
        opts = ExploreOptions(
            role=args.role, flush=args.flush, puts=args.puts, puts_after=args.puts_after,
            producers=args.producers, slave_ahead_policy=args.slave_ahead_policy,
            ha_ship_limit=args.ha_ship_limit, failover=args.failover, ha_mode=args.ha_mode,
            slaves=args.slaves, body_bytes=args.body_bytes, consumer=args.consumer,
            emulate=emulate, seed=args.seed, max_disk_states=args.max_disk_states,
            fsync_ms=args.fsync_ms, targets=tuple(args.targets.split(",")),
            events=args.events or ()).validate()
    except (EmulateError, ValueError) as exc:
        raise UserError(str(exc)) from None
    if args.workers is not None and args.spark_master is not None:
        raise UserError("--workers and --spark-master: give one (--workers N runs the runs on "
                        "a pool of N processes instead of Spark)")
    results_dir(args.out)
    try:
        counts, findings = explore(
            opts, args.out, workers=args.workers or 1, log=lambda s: print(s, flush=True),
            spark_master=None if args.workers is not None else args.spark_master or "local[*]")
    except ExploreError as exc:
        raise UserError(str(exc)) from None
    print(f"{opts.mode}: {counts.crash_points} crash points, {counts.states} disk states "
          f"explored in {counts.runs} runs, {counts.pruned} pruned as equivalent, "
          f"{counts.cut} past the bound; {counts.seconds:.0f} s")
    for kind in KINDS:
        _print_kind(kind, [f for f in findings if kind in f["kinds"]], args.out)
    print(f"every event and finding: {os.path.join(args.out, 'explore.json')}")
    return 1 if counts.findings[VIOLATION] else 0


def _print_kind(kind: str, rows: Sequence[dict[str, Any]], out: str) -> None:
    points = sorted({(r["event"], r["label"]) for r in rows})
    print(f"{kind}: {len(rows)} runs at {len(points)} crash points")
    for event, label in points[:20]:
        targets = sorted({r["target"] + (f" (then {r['promote']} promoted)" if r.get("promote")
                                         else "") for r in rows if r["event"] == event})
        print(f"  crash point {event} ({label}): {', '.join(targets)}")
    if len(points) > 20:
        print(f"  and {len(points) - 20} more crash points")
    for r in rows[:SHOWN_PER_KIND]:
        print(f"  replay: dlab chaos replay {os.path.join(out, r['case'])}")


def register(csub: Any) -> None:
    p = csub.add_parser(
        "explore", help="crash a small workload at every crash point, in every disk state",
        description="Runs a small deterministic workload on the sim backend once as a "
        "reference, recording every crash point: each event where a node's durable or "
        "replicated state changes (a file write, an fsync or directory fsync completing, a "
        "replication range shipped or applied, a slave's report of a new offset, an answer "
        "sent to a client). Then, for every crash point and target (master, slave, both), "
        "for every state the page-cache model lets a crash leave on the crashed disks "
        "(each file's unsynced writes kept as a prefix, or torn at a sector boundary), it "
        "runs the workload again, crashes there, restarts and recovers the crashed nodes, "
        "sends --puts-after more puts to the recovered cluster, settles and judges every "
        "PUT_OK as any run is judged. States that leave the same bytes are run once. "
        "Every state that breaks a promise, leaves a slave ahead, diverges, loses an "
        "acknowledged message (as its mode allows) or, with --consumer, loses a delivered "
        "message or never delivers a stored one is kept as a case under OUT/cases/, "
        "replayable byte for byte with `dlab chaos replay`.", epilog=EXPLORE_EXIT)
    p.add_argument("--role", choices=ROLES, default="SYNC_MASTER",
                   help="the master's role (default %(default)s)")
    p.add_argument("--flush", choices=FLUSHES, default="SYNC_FLUSH",
                   help="every node's flush mode (default %(default)s)")
    p.add_argument("--puts", type=positive_int, default=6,
                   help="puts in all (default %(default)s)")
    p.add_argument("--puts-after", type=int, default=None, metavar="N",
                   help="puts after the crashed nodes restarted, once the master has heard from "
                   "its slaves again, judged as the others (default: half of --puts; 0: none, "
                   "the nodes restart after the load)")
    p.add_argument("--producers", type=positive_int, default=2,
                   help="producers sending them (default %(default)s)")
    p.add_argument("--slaves", type=positive_int, default=1,
                   help="slaves of the master (default %(default)s; target slave is the first)")
    p.add_argument("--body-bytes", type=positive_int, default=1024,
                   help="each put's body (default %(default)s)")
    p.add_argument("--consumer", action="store_true",
                   help="a consumer consumes while the producers produce (default: none)")
    p.add_argument("--slave-ahead-policy", choices=SLAVE_AHEAD_POLICIES, default="reject",
                   help="what a master does when a slave reports more than it has: reject "
                   "(default, RocketMQ 4.9.3+), trust or truncate (as `dlab chaos run`)")
    p.add_argument("--ha-ship-limit", choices=SHIP_LIMITS, default="wrote",
                   help="ship bytes up to the master's written (default) or flushed position")
    p.add_argument("--failover", action="store_true",
                   help="after a crash of the master, fail over instead of restarting it in "
                   "place: promote each running slave in turn (one run each), or in controller "
                   "mode await the controller's election; the old master rejoins as a slave "
                   "(default: restart in place)")
    p.add_argument("--ha-mode", choices=HA_MODES, default="classic",
                   help="classic (default) or controller: a controller elects the master "
                   "(SYNC_MASTER then means allAckInSyncStateSet, ASYNC_MASTER no wait)")
    p.add_argument("--emulate", action="append", default=[], metavar="BUG",
                   help="re-introduce a known bug or planted fault on every node (see `dlab "
                   "chaos bugs`), e.g. planted-ack-before-fsync; repeatable (default: none)")
    p.add_argument("--seed", type=int, default=1,
                   help="the timing of the run: network delays, the workload's bodies "
                   "(default %(default)s)")
    p.add_argument("--fsync-ms", type=positive_float, default=5.0,
                   help="how long the disk's fsync takes, each 0.5-1.5 times it (default "
                   "%(default)s: a busy disk, so replication overtakes the flush)")
    p.add_argument("--max-disk-states", type=positive_int, default=256,
                   help="at most this many disk states per crash point and target (default "
                   "%(default)s); the output says how many fell past it")
    p.add_argument("--targets", default="master,slave,both",
                   help="which nodes crash, comma-separated: master, slave, both (default "
                   "%(default)s)")
    p.add_argument("--events", type=event_list, default=None, metavar="LIST",
                   help="only these crash points (numbers from the reference run, e.g. "
                   "3,10-14; default: every one)")
    p.add_argument("--spark-master", default=None, metavar="URL",
                   help="run the runs as Spark tasks on this master, as the sim sweeps do "
                   "(default local[*]: every core here; a cluster URL: OUT must be at the "
                   "same path on every executor)")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="instead of Spark, run the runs on a pool of N processes (1: in "
                   "this process)")
    p.add_argument("--out", default="dlab-explore", metavar="DIR",
                   help="directory for explore.json, the reference run and the cases "
                   "(default %(default)s)")
    p.set_defaults(handler=cmd_explore)
