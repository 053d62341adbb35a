"""The epoch-file and rejoin writer run as a real child process by the crash
tests of ha/autoswitch: armed failpoints SIGKILL it (store/failpoints.py's
`crash` action), on a real disk.

Modes:
  save     open the epoch file at --path and replace its list with --entries
           ("1-0,2-100"; "" for none)
  rejoin   open the store at --dir (running recovery) and its epoch file
           (<dir>/epochFileCheckpoint), recover the file to the log, then
           rejoin a master holding --master ending at --master-end
Prints DONE when it finishes; a failpoint that fires kills it first.
"""

from __future__ import annotations

import argparse
import os
import sys

from ha.autoswitch.epoch_file import FILE_NAME, EpochFile
from ha.autoswitch.epochs import EpochList
from ha.autoswitch.rejoin import recover, rejoin
from store.config import TESTING
from store.failpoints import Failpoints
from store.seams.disk import RealDisk
from store.store import MessageStore


def parse_entries(text: str) -> EpochList:
    pairs = [tuple(int(x) for x in item.split("-")) for item in text.split(",") if item]
    return EpochList.of(*((e, s) for e, s in pairs))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["save", "rejoin"])
    p.add_argument("--path")
    p.add_argument("--dir")
    p.add_argument("--entries", default="")
    p.add_argument("--master", default="")
    p.add_argument("--master-end", type=int, default=0)
    p.add_argument("--emulate", default="")
    p.add_argument("--failpoints", default="")
    args = p.parse_args()
    failpoints = Failpoints(args.failpoints)
    emulate = frozenset(filter(None, args.emulate.split(",")))
    if args.mode == "save":
        f = EpochFile(RealDisk(), args.path, failpoints=failpoints, emulate=emulate)
        f.replace(parse_entries(args.entries))
    else:
        store = MessageStore.open(args.dir, TESTING.with_(emulate=emulate),
                                  failpoints=failpoints)
        try:
            epochs = EpochFile(RealDisk(), os.path.join(args.dir, FILE_NAME),
                               failpoints=failpoints, emulate=emulate)
            recover(store, epochs)
            rejoin(store, epochs, parse_entries(args.master), args.master_end)
        finally:
            store.close_sync()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
