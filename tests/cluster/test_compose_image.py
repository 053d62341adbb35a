"""The node image: built offline from a local base image, runnable, cached.

The decisions (base image plan, wheel target, what is stale) are tested as
pure functions everywhere. The builds run against a real Docker engine and
skip, saying why, where none answers. Nothing here pulls from a registry.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from support.compose_support import (
    ROOT,
    needs_engine,
    one_engine_user,
    remove_images,
    snapshot_sources,
)

from cluster.backends import image as img
from cluster.cli.main import main

SCRIPT = ROOT / "compose" / "make-base-image.sh"
pytestmark = one_engine_user
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="debootstrap (the base image from scratch) needs root")


# --- pure decisions -------------------------------------------------------------


def test_default_base_prefers_what_is_present_and_never_pulls_then() -> None:
    steps = img.plan_base(requested=None, present={img.LOCAL_BASE_IMAGE}, rebuild=False)
    assert steps == (img.BaseStep(img.BaseAction.USE, img.LOCAL_BASE_IMAGE),)
    steps = img.plan_base(requested=None, present={img.DEFAULT_BASE_IMAGE, img.LOCAL_BASE_IMAGE},
                          rebuild=False)
    assert steps == (img.BaseStep(img.BaseAction.USE, img.DEFAULT_BASE_IMAGE),)


def test_default_base_on_a_machine_with_no_images_pulls_then_makes_the_local_one() -> None:
    steps = img.plan_base(requested=None, present=set(), rebuild=False)
    assert steps == (img.BaseStep(img.BaseAction.PULL, img.DEFAULT_BASE_IMAGE),
                     img.BaseStep(img.BaseAction.MAKE, img.LOCAL_BASE_IMAGE))


def test_named_base_has_no_fallback_and_local_tags_are_made() -> None:
    assert img.plan_base(requested="python:3.12-slim", present=set(), rebuild=False) == (
        img.BaseStep(img.BaseAction.PULL, "python:3.12-slim"),)
    assert img.plan_base(requested="durability-lab/base:x", present=set(), rebuild=False) == (
        img.BaseStep(img.BaseAction.MAKE, "durability-lab/base:x"),)
    assert img.plan_base(requested="durability-lab/base:x", present={"durability-lab/base:x"},
                         rebuild=True) == (img.BaseStep(img.BaseAction.MAKE,
                                                        "durability-lab/base:x"),)
    assert img.plan_base(requested="python:3.12-slim", present={"python:3.12-slim"},
                         rebuild=True) == (img.BaseStep(img.BaseAction.USE, "python:3.12-slim"),)


def test_python_target_parses_the_probe_and_lists_manylinux_tags() -> None:
    target = img.PythonTarget.parse("3 11 x86_64 glibc 2.36\n")
    assert target == img.PythonTarget(version=(3, 11), machine="x86_64", glibc=(2, 36))
    tags = target.platform_tags()
    assert tags[0] == "manylinux_2_36_x86_64"
    assert "manylinux_2_17_x86_64" in tags and tags[-1] == "manylinux2014_x86_64"
    assert target.suits_host(version=(3, 11), machine="x86_64", system="Linux")
    assert not target.suits_host(version=(3, 12), machine="x86_64", system="Linux")
    assert not target.suits_host(version=(3, 11), machine="arm64", system="Darwin")
    for bad in ("3 11 x86_64", "3 11 x86_64 musl 1.2", ""):
        with pytest.raises(ValueError):
            img.PythonTarget.parse(bad)


def test_node_requirements_are_pyproject_minus_the_report_stack() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    excludes = img.parse_excludes((ROOT / "compose" / "node-excludes.txt").read_text())
    assert {"pyspark", "pandas", "pyarrow", "matplotlib"} <= excludes
    kept = img.node_requirements(pyproject, excludes)
    names = {img.canonical_name(req) for req in kept}
    assert {"grpcio", "grpcio-health-checking", "protobuf", "crcmod", "tenacity"} <= names
    assert not names & excludes
    # Every excluded name is a real dependency: the list does not rot silently.
    import tomllib

    declared = {img.canonical_name(r) for r in tomllib.loads(pyproject)["project"]["dependencies"]}
    assert excludes <= declared


def test_dependency_key_follows_requirements_and_target() -> None:
    target = img.PythonTarget(version=(3, 11), machine="x86_64", glibc=(2, 36))
    host = img.WheelSource.HOST
    key = img.deps_key(requirements=["a>=1", "b"], target=target, source=host)
    assert key == img.deps_key(requirements=["a>=1", "b"], target=target, source=host)
    other_target = img.PythonTarget(version=(3, 12), machine="x86_64", glibc=(2, 36))
    for changed in (
        img.deps_key(requirements=["a>=2", "b"], target=target, source=host),
        img.deps_key(requirements=["a>=1b"], target=target, source=host),
        img.deps_key(requirements=["a>=1", "b"], target=other_target, source=host),
        img.deps_key(requirements=["a>=1", "b"], target=target, source=img.WheelSource.DOWNLOAD),
    ):
        assert changed != key


def test_cached_steps_are_counted_after_from() -> None:
    output = ["Step 1/4 : ARG BASE_IMAGE=x", "Step 2/4 : FROM ${BASE_IMAGE}", " ---> 5fcf",
              "Step 3/4 : COPY a b", " ---> Using cache", " ---> 6a4c",
              "Step 4/4 : RUN true", " ---> Running in f3fb", " ---> 9abc"]
    assert img.count_cached_steps(output) == (2, 1)


# --- the engine is absent -----------------------------------------------------------


def test_build_says_clearly_when_no_engine_answers(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    monkeypatch.setenv("DLAB_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["image", "build"]) == 2
    err = capsys.readouterr().err
    assert "no Docker engine answers" in err and "no-engine.sock" in err
    assert "Traceback" not in err


def test_base_script_says_clearly_when_no_engine_answers(tmp_path: Path) -> None:
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock",
           "DLAB_CACHE_DIR": str(tmp_path)}
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                            check=False)
    assert result.returncode == 3
    assert "no Docker engine answers" in result.stderr


# --- real builds --------------------------------------------------------------------


def _run(image: str, *args: str, entrypoint: str | None = None) -> subprocess.CompletedProcess[str]:
    """docker run --rm, no network: the container is gone when this returns."""
    cmd = ["docker", "run", "--rm", "--network", "none"]
    if entrypoint is not None:
        cmd += ["--entrypoint", entrypoint]
    return subprocess.run([*cmd, image, *args], capture_output=True, text=True, timeout=120,
                          check=False)


def _assert_node_image_works(tag: str) -> None:
    helped = _run(tag, "--help")
    assert helped.returncode == 0, helped.stderr
    assert "usage: dlab" in helped.stdout
    imports = _run(tag, "-c", "import sys, store, ha, cluster, proto, chaos, grpc, crcmod; "
                   "assert sys.version_info >= (3, 11); print(sys.prefix)", entrypoint="python3")
    assert imports.returncode == 0, imports.stderr
    assert imports.stdout.strip() == "/opt/dlab"
    # The report stack stays on the host.
    report = _run(tag, "-c", "import pyspark", entrypoint="python3")
    assert report.returncode != 0 and "No module named 'pyspark'" in report.stderr


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return snapshot_sources(tmp_path_factory.mktemp("sources"))


@needs_engine
def test_node_image_builds_runs_and_second_build_is_a_cache_hit(sources: Path) -> None:
    first = img.build_node_image(source_root=sources)
    assert first.tag == img.NODE_IMAGE and first.image_id.startswith("sha256:")
    _assert_node_image_works(first.tag)

    second = img.build_node_image(source_root=sources)
    assert second.deps_reused and second.project_reused
    assert second.image_id == first.image_id
    assert second.steps > 0 and second.steps_cached == second.steps
    assert second.seconds["total"] < 15, second.seconds


@needs_engine
def test_build_command_reports_the_image() -> None:
    result = subprocess.run([sys.executable, "-m", "cluster.cli", "image", "build"],
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{img.NODE_IMAGE} sha256:")
    assert "steps from cache" in result.stdout


@needs_engine
@pytest.mark.slow
def test_downloaded_wheels_build_a_working_image(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sources: Path) -> None:
    """The path for a host whose Python differs from the image's: binary
    wheels for the image's Python, and crcmod (sdist only) built inside."""
    monkeypatch.setenv("DLAB_CACHE_DIR", str(tmp_path))
    tag = f"durability-lab/node:test-download-{uuid.uuid4().hex[:8]}"
    try:
        built = img.build_node_image(tag=tag, wheels=img.WheelSource.DOWNLOAD,
                                     source_root=sources)
        assert built.wheel_source is img.WheelSource.DOWNLOAD
        _assert_node_image_works(tag)
        crc = _run(tag, "-c", "import zlib, crcmod.predefined as p; "
                   "assert p.mkCrcFun('crc-32')(b'abc') == zlib.crc32(b'abc')",
                   entrypoint="python3")
        assert crc.returncode == 0, crc.stderr
    finally:
        remove_images(tag)


@needs_engine
@needs_root
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_image_builds_offline_from_scratch(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sources: Path) -> None:
    """No base image, no cached root tarball, no wheels: debootstrap, import,
    wheels, build (with networking off). Then everything is reused. Measured
    on a 2-CPU machine: about 1.5 min from scratch, under a second cached."""
    monkeypatch.setenv("DLAB_CACHE_DIR", str(tmp_path))
    suffix = uuid.uuid4().hex[:8]
    base = f"durability-lab/base:test-{suffix}"
    tag = f"durability-lab/node:test-{suffix}"
    try:
        started = time.monotonic()
        first = img.build_node_image(tag=tag, base_image=base, source_root=sources)
        scratch_s = time.monotonic() - started
        assert first.base_how == "made" and not first.deps_reused
        assert any(tmp_path.glob("base-bookworm-*.tar"))  # the cached root
        _assert_node_image_works(tag)

        again = img.build_node_image(tag=tag, base_image=base, source_root=sources)
        assert again.base_how == "present" and again.deps_reused and again.project_reused
        assert again.image_id == first.image_id and again.steps_cached == again.steps
        assert again.seconds["total"] < scratch_s / 5, (again.seconds, scratch_s)

        # The image gone, the cached root tarball brings it back without debootstrap.
        remove_images(tag, base)
        started = time.monotonic()
        made = subprocess.run(["bash", str(SCRIPT), "--tag", base], capture_output=True,
                              text=True, timeout=300, check=False)
        assert made.returncode == 0, made.stderr
        assert "importing" in made.stderr and "debootstrap took" not in made.stderr
        assert time.monotonic() - started < scratch_s / 2
        present = subprocess.run(["bash", str(SCRIPT), "--tag", base], capture_output=True,
                                 text=True, timeout=60, check=False)
        assert present.returncode == 0 and "nothing to do" in present.stderr
    finally:
        remove_images(tag, base)
