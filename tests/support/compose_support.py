"""Shared by the tests that need a Docker engine: the skip marker (one ping
of the engine, with the reason it failed), a snapshot of the sources for
image builds, and image clean-up."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cluster.backends import image as img
from cluster.backends.docker_engine import unavailable_reason

ROOT = Path(__file__).resolve().parents[2]

ENGINE_MISSING = unavailable_reason()
needs_engine = pytest.mark.skipif(
    ENGINE_MISSING is not None, reason=f"needs a Docker engine: {ENGINE_MISSING}")
# Under pytest-xdist (scripts/test), every test that talks to the engine runs
# on one worker: they share the default node image tag and the base image,
# and two image builds at once only slow each other down.
one_engine_user = pytest.mark.xdist_group("docker")


def snapshot_sources(dest: Path) -> Path:
    """Copy what an image is built from: others edit the shared tree while
    tests run, and a cache-hit test needs sources that hold still."""
    compose = [path for path in (ROOT / "compose").iterdir() if path.is_file()]
    for path in [*img.project_files(ROOT), *compose]:
        target = dest / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    return dest


def remove_images(*tags: str) -> None:
    for tag in tags:
        subprocess.run(["docker", "rmi", "--force", tag], capture_output=True, check=False)
