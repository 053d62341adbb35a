"""What the entries of a store directory must be before anything opens them:
regular files where the store keeps files, directories where it keeps
directories, and never a symbolic link.

The store writes its files in place (the pid into `lock`, `abort`, the
checkpoint, segments extended or cut by recovery, the durable mark, consume
queue units, consumer offsets). Through a link each of those writes would
change a file outside the store — any file on the machine, for a node run as
root. So an open checks the whole layout first, before the lock is taken or
any file written, and refuses while one entry is wrong, naming every one
(docs/design.md, "A store never follows a link"). RealDisk also opens the
store's files with O_NOFOLLOW, for a link made after this check.

Only what the store itself reaches is checked: the store root's files and
its `commitlog/`, `consumequeue/` and `config/` trees, as deep as the store
reads them. The store root itself may be a link (a data directory on another
volume): the user named it.
"""

from __future__ import annotations

import os

from store.consume.consumequeue import DIR_NAME as CONSUME_QUEUE_DIR
from store.log.durable_mark import MARK_FILE
from store.seams.disk import Disk

# The store root's files (store/store.py, store/log/durable_mark.py).
ROOT_FILES = ("lock", "abort", "checkpoint", MARK_FILE)
# The store root's directories and how many levels of each the store reads:
# commitlog/<segment>, consumequeue/<topic>/<queue id>/<file>,
# config/consumerOffset.json (and .bak, .tmp).
ROOT_DIRS = {"commitlog": 1, CONSUME_QUEUE_DIR: 3, "config": 1}

_LINK_FIX = ("is a symbolic link; a store never follows one (its writes would land in "
             "the file it points to): put the file itself there, or move the link aside")


def _kind(disk: Disk, path: str) -> str | None:
    """"link", "dir", "file", "other" (a device, pipe or socket), or None
    when nothing is there. The link test comes first and does not follow
    it, so the other answers describe the entry itself."""
    if disk.islink(path):
        return "link"
    if disk.isdir(path):
        return "dir"
    if disk.isfile(path):
        return "file"
    return "other" if disk.exists(path) else None


def _problem(path: str, kind: str | None, want: str) -> str | None:
    """What is wrong with `path` being `kind` where the store keeps a
    `want` ("file" or "dir"), or None."""
    if kind is None or kind == want:
        return None
    if kind == "link":
        return f"{path} {_LINK_FIX}"
    if kind == "other":
        return (f"{path} is not a regular file or directory (a device, pipe or socket): "
                "move it aside")
    if want == "file":
        note = (" (without a checkpoint, recovery only scans more)"
                if os.path.basename(path) == "checkpoint" else "")
        return f"{path} is a directory where the store keeps a file: move it aside{note}"
    return f"{path} is a file where the store keeps a directory: move it aside"


def layout_problems(disk: Disk, root: str) -> list[str]:
    """One sentence per entry of the store at `root` that is a link or of
    the wrong kind, naming its path and the fix; empty when the layout is
    sound (or `root` does not exist yet). Reads only: lstat and listings.
    An entry that cannot be examined (no permission) is left to the open,
    whose own error names it."""
    problems: list[str] = []
    for name in ROOT_FILES:
        path = os.path.join(root, name)
        bad = _problem(path, _kind(disk, path), "file")
        if bad:
            problems.append(bad)
    for name, depth in ROOT_DIRS.items():
        path = os.path.join(root, name)
        kind = _kind(disk, path)
        bad = _problem(path, kind, "dir")
        if bad:
            problems.append(bad)
        elif kind == "dir":
            _walk(disk, path, depth, problems)
    return problems


def _walk(disk: Disk, directory: str, depth: int, problems: list[str]) -> None:
    """Links and entries neither file nor directory in `directory` and the
    `depth - 1` levels below it."""
    try:
        names = disk.listdir(directory)
    except OSError:
        return
    for name in names:
        path = os.path.join(directory, name)
        kind = _kind(disk, path)
        if kind in ("link", "other"):
            bad = _problem(path, kind, "file")
            assert bad is not None
            problems.append(bad)
        elif kind == "dir" and depth > 1:
            _walk(disk, path, depth - 1, problems)


def refusal(root: str, problems: list[str]) -> str:
    """The message of an open refused for `problems` (layout_problems): one
    line for one problem (what a command line prints last), else one each."""
    head = f"store {root} cannot be opened (nothing was changed, in it or where a link points)"
    if len(problems) == 1:
        return f"{head}: {problems[0]}"
    return f"{head}:\n  " + "\n  ".join(problems)
