"""Writing the files of a cluster directory (`cluster.json`, `cluster.lock`,
`token`, node and proxy logs) never through a symbolic link: `dlab cluster`
often runs as root, and a link there would have it write into any file on
the machine (docs/design.md, "A store never follows a link"; the node's own
store checks its files in store/layout.py). A link is refused with a
BackendError naming it."""

from __future__ import annotations

import errno
import os

from cluster.backends.interface import BackendError
from cluster.node.auth import write_token_file


def link_refused(path: str) -> BackendError:
    return BackendError(f"{path} is a symbolic link; dlab never writes through one in a "
                        "cluster directory (it would change the file it points to): "
                        "remove the link, or use another --dir")


def open_no_link(path: str, flags: int, mode: int = 0o644) -> int:
    """os.open(path, flags | O_NOFOLLOW, mode); a link raises BackendError
    (link_refused), any other failure its OSError."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise link_refused(path) from None
        raise


def append_no_link(path: str) -> int:
    """A descriptor appending to the log at `path` (created if missing)."""
    return open_no_link(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def replace_no_link(path: str) -> int:
    """A descriptor for `path` emptied (created if missing), for a new
    version of it written whole."""
    return open_no_link(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)


def write_token(path: str, token: str) -> None:
    """The cluster's token file (cluster/node/auth.py writes it with
    O_NOFOLLOW); a link there is refused by name."""
    try:
        write_token_file(path, token)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise link_refused(path) from None
        raise
