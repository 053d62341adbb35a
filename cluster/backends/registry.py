"""The backends by name: open the one asked for, or the one a cluster
directory was made with. Apart from cluster/backends/interface.py (the interface) so
that the implementations, which import the interface, are not imported back
by it."""

from __future__ import annotations

import json
import os

from cluster.backends.compose import ComposeBackend
from cluster.backends.image import CheckedImages
from cluster.backends.interface import BackendError, ClusterBackend
from cluster.backends.local import LocalBackend
from cluster.backends.state_dir import STATE_FILE

BACKEND_NAMES = ("local", "compose")


def open_backend(name: str, directory: str, *,
                 images: CheckedImages | None = None) -> ClusterBackend:
    """The backend called `name` for the cluster in `directory`; `images`:
    the node images its caller has already brought up to date (compose)."""
    if name == "local":
        return LocalBackend(directory)
    if name == "compose":
        return ComposeBackend(directory, images=images)
    raise BackendError(f"unknown backend {name!r}; use one of {', '.join(BACKEND_NAMES)}")


def backend_of(directory: str) -> ClusterBackend:
    """The backend of the cluster `up` made in `directory` (it writes its name
    into cluster.json); local when there is no cluster there yet."""
    try:
        with open(os.path.join(directory, STATE_FILE), encoding="utf-8") as f:
            name = json.load(f).get("backend", "local")
    except (OSError, ValueError):
        name = "local"
    return open_backend(name, directory)
