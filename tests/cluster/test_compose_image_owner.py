"""Which node images are up to date is remembered by an owner
(cluster/backends/image.py CheckedImages: a chaos command shares one over
its runs), not by the compose module for the whole process. Against a real
Docker engine, with a scratch image made for the test and removed after."""

from __future__ import annotations

import io
import secrets
import subprocess
import tarfile
from collections.abc import Iterator

import pytest
from support.compose_support import needs_engine, one_engine_user, remove_images

from cluster.backends.compose import ComposeBackend
from cluster.backends.image import CheckedImages
from cluster.backends.interface import BackendError

pytestmark = [needs_engine, one_engine_user, pytest.mark.timeout(120)]


@pytest.fixture
def scratch_image() -> Iterator[str]:
    """A tiny image under a tag no one else uses (`docker import` of a tar
    holding one file)."""
    tag = f"dlab-test/owner-{secrets.token_hex(4)}:scratch"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("marker")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"h8"))
    subprocess.run(["docker", "import", "-", tag], input=buf.getvalue(), check=True,
                   capture_output=True, timeout=60)
    try:
        yield tag
    finally:
        remove_images(tag)


def _image_id(tag: str) -> str:
    return subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", tag],
                          check=True, capture_output=True, text=True, timeout=60).stdout.strip()


def test_a_checked_image_is_remembered_by_its_owner_only(scratch_image: str) -> None:
    shared = CheckedImages()
    ComposeBackend(image=scratch_image, build_image=False, images=shared)._ensure_image()
    assert scratch_image in shared
    # The next run of the same owner trusts it: no build replaces the image
    # under its tag (a build would tag the node image there).
    before = _image_id(scratch_image)
    ComposeBackend(image=scratch_image, build_image=True, images=shared)._ensure_image()
    assert _image_id(scratch_image) == before
    # Another owner (another command, or a backend on its own) checks for itself.
    assert scratch_image not in CheckedImages()
    own = ComposeBackend(image=scratch_image, build_image=False)
    remove_images(scratch_image)
    with pytest.raises(BackendError, match="no node image"):
        own._ensure_image()  # checks again: the image is gone, and it says so


def test_a_missing_image_is_not_remembered(scratch_image: str) -> None:
    shared = CheckedImages()
    absent = f"{scratch_image}-absent"
    with pytest.raises(BackendError, match="dlab image build"):
        ComposeBackend(image=absent, build_image=False, images=shared)._ensure_image()
    assert absent not in shared
