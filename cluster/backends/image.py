"""`dlab image build`: the node image, built with no registry and no network.

What it does, and what it reuses on the next build:

1. **Base image.** python:3.11-slim where it is here or can be pulled; else
   the local `durability-lab/base:bookworm` that compose/make-base-image.sh
   makes (debootstrap + `docker import`). A base image already present is used
   without trying the registry, so a second build needs no network at all.
2. **Wheels**, on the host, into the build context under the cache directory
   (DLAB_CACHE_DIR, else $XDG_CACHE_HOME/durability-lab, else
   ~/.cache/durability-lab):
   - dependencies: pyproject.toml's `dependencies` minus
     compose/node-excludes.txt (the report stack a node never imports), plus
     pip itself. Built with `pip wheel` by a host Python of the image's version
     and platform; where there is none, downloaded for the image's Python with
     `pip download --only-binary=:all: --python-version X.Y --platform
     manylinux...`, and a requirement that ships no wheel at all (crcmod) comes
     as an sdist that pip builds inside the image, offline, from the setuptools
     wheel downloaded alongside. Reused while the node's requirements (as
     pyproject.toml and the excludes give them) and the image's Python are
     unchanged.
   - the project: one wheel, rebuilt only when a source file changed, and
     byte-for-byte reproducible (SOURCE_DATE_EPOCH) so the layer cache holds.
3. **The image**, `docker build` of compose/Dockerfile with networking off;
   Docker's layer cache makes an unchanged rebuild a few seconds.

The decisions (which base, which wheel source, what is stale) are pure
functions of facts gathered first; the Docker engine, pip and the files are
touched only by the functions after them.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster.backends.docker_engine import EngineUnavailableError, connect

if TYPE_CHECKING:
    import docker

DEFAULT_BASE_IMAGE = "python:3.11-slim"
LOCAL_BASE_IMAGE = "durability-lab/base:bookworm"
# Any tag of this repository is a base image compose/make-base-image.sh makes.
LOCAL_BASE_REPOSITORY = "durability-lab/base"
NODE_IMAGE = "durability-lab/node:latest"
# The import packages the project wheel holds (pyproject's packages.find).
PACKAGES = ("store", "ha", "proto", "cluster", "chaos")
# 1980-01-01, the earliest time a zip entry can hold: the project wheel's bytes
# then depend on the sources only, so an unchanged project hits the layer cache.
SOURCE_DATE_EPOCH = "315532800"
# What the probe prints inside the base image: "3 11 x86_64 glibc 2.36".
_PROBE = (
    "import sys, platform; "
    "print(*sys.version_info[:2], platform.machine(), *platform.libc_ver())"
)

Log = Callable[[str], None]


# --- pure core -------------------------------------------------------------


class BaseAction(enum.StrEnum):
    USE = "use"  # present here
    PULL = "pull"  # from a registry
    MAKE = "make"  # compose/make-base-image.sh


@dataclass(frozen=True)
class BaseStep:
    action: BaseAction
    image: str


def plan_base(*, requested: str | None, present: Collection[str], rebuild: bool
              ) -> tuple[BaseStep, ...]:
    """The steps to try, in order, to have a base image; the first that works
    wins and a failed step falls through to the next (none left: an error).

    - `--base-image X`: X if present; made by the script if X is a tag of
      durability-lab/base; else pulled. No fallback: the user asked for X.
    - default: python:3.11-slim if present, else the local base if present
      (a base that is here is never traded for a registry round trip), else
      pull python:3.11-slim, else make the local base.
    - rebuild: the local base is made again when it is the one used; images
      from a registry are not pulled again.
    """
    if requested is not None:
        local = requested.startswith(LOCAL_BASE_REPOSITORY + ":")
        if local and (rebuild or requested not in present):
            return (BaseStep(BaseAction.MAKE, requested),)
        if requested in present:
            return (BaseStep(BaseAction.USE, requested),)
        return (BaseStep(BaseAction.PULL, requested),)
    if DEFAULT_BASE_IMAGE in present:
        return (BaseStep(BaseAction.USE, DEFAULT_BASE_IMAGE),)
    if LOCAL_BASE_IMAGE in present:
        action = BaseAction.MAKE if rebuild else BaseAction.USE
        return (BaseStep(action, LOCAL_BASE_IMAGE),)
    return (BaseStep(BaseAction.PULL, DEFAULT_BASE_IMAGE),
            BaseStep(BaseAction.MAKE, LOCAL_BASE_IMAGE))


@dataclass(frozen=True)
class PythonTarget:
    """The interpreter inside the base image, which every wheel must suit."""

    version: tuple[int, int]
    machine: str  # platform.machine(): x86_64, aarch64
    glibc: tuple[int, int]

    @classmethod
    def parse(cls, probe_output: str) -> PythonTarget:
        """Parse what _PROBE prints; ValueError for anything else."""
        fields = probe_output.split()
        if len(fields) != 5 or fields[3] != "glibc":
            raise ValueError(f"expected 'MAJOR MINOR MACHINE glibc X.Y', got {probe_output!r}")
        libc_major, libc_minor = fields[4].split(".")[:2]
        return cls(version=(int(fields[0]), int(fields[1])), machine=fields[2],
                   glibc=(int(libc_major), int(libc_minor)))

    @property
    def python_version(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"

    def platform_tags(self) -> list[str]:
        """Every manylinux tag this glibc runs, newest first (pip download
        takes the list literally, so the older ones are spelled out)."""
        if self.glibc[0] != 2 or self.glibc[1] < 17:
            raise ValueError(f"glibc {self.glibc} is older than manylinux2014 (2.17)")
        tags = [f"manylinux_2_{minor}_{self.machine}"
                for minor in range(self.glibc[1], 16, -1)]
        return [*tags, f"manylinux2014_{self.machine}"]

    def suits_host(self, *, version: tuple[int, int], machine: str, system: str) -> bool:
        """Whether wheels `pip wheel` makes on that host would run in the image."""
        return system == "Linux" and version == self.version and machine == self.machine


class WheelSource(enum.StrEnum):
    AUTO = "auto"  # host when a host Python suits the image, else download
    HOST = "host"  # `pip wheel` with a host Python of the image's version
    DOWNLOAD = "download"  # `pip download` of binaries for the image's Python


def canonical_name(requirement: str) -> str:
    """The PEP 503 name at the start of a requirement string."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def parse_excludes(text: str) -> frozenset[str]:
    """compose/node-excludes.txt: one distribution name a line, # comments."""
    names = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return frozenset(canonical_name(name) for name in names if name)


def node_requirements(pyproject_text: str, excludes: Collection[str]) -> list[str]:
    """pyproject's dependencies a node needs: all but the excluded ones.
    Deriving the list (rather than keeping a second one) means a dependency
    added to pyproject reaches the image unless someone decides otherwise."""
    dependencies: list[str] = tomllib.loads(pyproject_text)["project"]["dependencies"]
    return [req for req in dependencies if canonical_name(req) not in excludes]


def digest(parts: Iterable[bytes | str]) -> str:
    """A key over parts, each length-prefixed so boundaries count."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()[:32]


def deps_key(*, requirements: Iterable[str], target: PythonTarget, source: WheelSource) -> str:
    """What the dependency wheels depend on. The requirements, not the whole
    pyproject.toml: a new dev tool or lint setting does not rebuild them."""
    return digest([*requirements, repr(target), source.value])


def count_cached_steps(build_output: Iterable[str]) -> tuple[int, int]:
    """(steps after FROM, of those taken from cache) in the classic builder's
    output. FROM and the ARGs before it are never cached or built, so they
    are not counted: a full cache hit is N/N."""
    steps = cached = 0
    after_from = False
    for line in build_output:
        step = re.match(r"Step \d+/\d+ : (\S+)", line)
        if step:
            steps += after_from
            after_from = after_from or step.group(1).upper() == "FROM"
        elif line.strip() == "---> Using cache":
            cached += 1
    return steps, cached


# --- IO edge ----------------------------------------------------------------


class CheckedImages:
    """The node images one owner (a chaos command, a backend) has brought
    up to date with this checkout: each is checked once, then used as it
    is while it exists, so every run the owner starts runs the same node
    code even if the sources change meanwhile, and pays for the check
    once."""

    def __init__(self) -> None:
        self._tags: set[str] = set()

    def __contains__(self, tag: object) -> bool:
        return tag in self._tags

    def add(self, tag: str) -> None:
        self._tags.add(tag)


class ImageBuildError(RuntimeError):
    """The build cannot go on; the message says why and what to do."""


@dataclass(frozen=True)
class ImageBuild:
    tag: str
    image_id: str
    base_image: str
    base_how: str  # "present" | "pulled" | "made"
    wheel_source: WheelSource
    deps_reused: bool
    project_reused: bool
    steps: int
    steps_cached: int
    seconds: dict[str, float]  # per phase: base, wheels, build, total


def cache_dir() -> Path:
    explicit = os.environ.get("DLAB_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "durability-lab"


def project_root(root: Path | None = None) -> Path:
    """The source checkout this module runs from (or `root`, e.g. a snapshot
    of it); images build from sources."""
    root = root or Path(__file__).resolve().parents[2]
    if not (root / "compose" / "Dockerfile").is_file() or not (root / "pyproject.toml").is_file():
        raise ImageBuildError(
            f"no compose/Dockerfile next to {root}: `dlab image build` runs from a source "
            "checkout of durability-lab (pip install -e .)"
        )
    return root


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One build per cache directory at a time (tests and users may race)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_node_image(*, tag: str = NODE_IMAGE, base_image: str | None = None,
                     rebuild: bool = False, wheels: WheelSource = WheelSource.AUTO,
                     log: Log = lambda line: None, build_log: Log = lambda line: None,
                     source_root: Path | None = None) -> ImageBuild:
    """Build the node image (see the module docstring). `log` gets one line
    per decision, `build_log` docker build's output. Raises
    EngineUnavailableError when no engine answers, ImageBuildError otherwise.
    `source_root` builds from another checkout than this module's."""
    root = project_root(source_root)
    client = connect()
    cache = cache_dir()
    work = cache / "node-image"
    context = work / "context"
    seconds: dict[str, float] = {}
    started = time.monotonic()
    with _locked(work / "lock"):
        present = {name for name in {DEFAULT_BASE_IMAGE, LOCAL_BASE_IMAGE, base_image}
                   if name is not None and _image_present(client, name)}
        plan = plan_base(requested=base_image, present=present, rebuild=rebuild)
        base, how = _ensure_base(client, plan, root=root, log=log)
        seconds["base"] = time.monotonic() - started

        mark = time.monotonic()
        target = _probe_target(client, base, work / "targets.json")
        source, python = _choose_wheel_source(wheels, target)
        log(f"image Python {target.python_version} {target.machine} glibc "
            f"{target.glibc[0]}.{target.glibc[1]}; wheels by {source.value}"
            + (f" with {python}" if python else ""))
        (context / "wheels").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / "compose" / "Dockerfile", context / "Dockerfile")
        deps_reused = _prepare_deps(context / "wheels" / "deps", work / "deps.key", root=root,
                                    target=target, source=source, python=python,
                                    rebuild=rebuild, log=log)
        project_reused = _prepare_project(context / "wheels" / "project", work / "project.key",
                                          root=root, rebuild=rebuild, log=log)
        seconds["wheels"] = time.monotonic() - mark

        mark = time.monotonic()
        image_id, output = _docker_build(client, context, base=base, tag=tag, nocache=rebuild,
                                         log=build_log)
        seconds["build"] = time.monotonic() - mark
    seconds["total"] = time.monotonic() - started
    steps, cached = count_cached_steps(output)
    return ImageBuild(tag=tag, image_id=image_id, base_image=base, base_how=how,
                      wheel_source=source, deps_reused=deps_reused,
                      project_reused=project_reused, steps=steps, steps_cached=cached,
                      seconds=seconds)


def _image_present(client: docker.DockerClient, name: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        client.images.get(name)
    except ImageNotFound:
        return False
    return True


def _ensure_base(client: docker.DockerClient, plan: tuple[BaseStep, ...], *, root: Path,
                 log: Log) -> tuple[str, str]:
    from docker.errors import APIError
    from docker.utils import parse_repository_tag

    failures: list[str] = []
    for step in plan:
        if step.action is BaseAction.USE:
            log(f"base image {step.image}: present")
            return step.image, "present"
        if step.action is BaseAction.PULL:
            log(f"base image {step.image}: pulling")
            repository, pull_tag = parse_repository_tag(step.image)
            try:
                # A slow registry may take minutes for a real pull; an absent
                # one fails at once (DNS or connection refused).
                connect(timeout_s=600).images.pull(repository, tag=pull_tag or "latest")
            except APIError as exc:
                reason = str(exc.explanation or exc).splitlines()[0]
                failures.append(f"cannot pull {step.image}: {reason}")
                log(failures[-1])
                continue
            return step.image, "pulled"
        log(f"base image {step.image}: making it with compose/make-base-image.sh")
        script = root / "compose" / "make-base-image.sh"
        args = ["bash", str(script), "--tag", step.image]
        if _image_present(client, step.image):  # only when a rebuild was asked for
            args.append("--rebuild")
        env = {**os.environ, "DLAB_CACHE_DIR": str(cache_dir())}
        result = subprocess.run(args, env=env, check=False)  # its progress goes to stderr
        if result.returncode == 3:
            raise EngineUnavailableError("no Docker engine answers (the base image script says)")
        if result.returncode != 0:
            failures.append(f"{script.name} failed (exit {result.returncode}; its output is above)")
            continue
        return step.image, "made"
    raise ImageBuildError("no base image: " + "; ".join(failures))


def _probe_target(client: docker.DockerClient, base: str, memo: Path) -> PythonTarget:
    """The base image's Python, remembered per image id (a run costs ~1 s)."""
    image_id = client.images.get(base).id
    known: dict[str, str] = {}
    with contextlib.suppress(OSError, ValueError):
        known = json.loads(memo.read_text())
    if image_id not in known:
        from docker.errors import ContainerError

        try:
            out = client.containers.run(base, ["python3", "-c", _PROBE], entrypoint=[],
                                        network_mode="none", remove=True)
        except ContainerError as exc:
            raise ImageBuildError(f"{base} has no working python3: {exc}") from exc
        known[image_id] = out.decode().strip()
        memo.write_text(json.dumps(known, indent=1))
    try:
        target = PythonTarget.parse(known[image_id])
    except ValueError as exc:
        raise ImageBuildError(f"{base}: cannot use its Python ({exc})") from exc
    if target.version < (3, 11):
        raise ImageBuildError(f"{base} has Python {target.python_version}; nodes need >= 3.11")
    return target


def _host_python_for(target: PythonTarget) -> str | None:
    """A host interpreter whose `pip wheel` output suits the image: this one,
    else pythonX.Y on PATH (with pip)."""
    if target.suits_host(version=sys.version_info[:2], machine=platform.machine(),
                         system=platform.system()):
        return sys.executable
    candidate = shutil.which(f"python{target.python_version}")
    if candidate is None:
        return None
    probe = subprocess.run(
        [candidate, "-c", "import platform, sys, pip; "
         "print(*sys.version_info[:2], platform.machine(), platform.system())"],
        capture_output=True, text=True, check=False)
    fields = probe.stdout.split()
    if probe.returncode != 0 or len(fields) != 4:
        return None
    if target.suits_host(version=(int(fields[0]), int(fields[1])), machine=fields[2],
                         system=fields[3]):
        return candidate
    return None


def _choose_wheel_source(wanted: WheelSource, target: PythonTarget
                         ) -> tuple[WheelSource, str | None]:
    if wanted is WheelSource.DOWNLOAD:
        return wanted, None
    python = _host_python_for(target)
    if python is not None:
        return WheelSource.HOST, python
    if wanted is WheelSource.HOST:
        raise ImageBuildError(
            f"--wheels host needs a Linux {target.machine} Python {target.python_version} "
            f"with pip on this host (as python{target.python_version} on PATH); "
            "use --wheels download (or auto) to download wheels for the image instead"
        )
    return WheelSource.DOWNLOAD, None


def _pip(python: str, *args: str, env: dict[str, str] | None = None) -> None:
    """Run pip quietly; on failure an ImageBuildError with the end of its output."""
    cmd = [python, "-m", "pip", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False,
                            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **(env or {})})
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-8:])
        raise ImageBuildError(f"pip {args[0]} failed:\n{tail}")


def _replace_dir(old: Path, new: Path) -> None:
    if old.exists():
        shutil.rmtree(old)
    new.rename(old)


def _prepare_deps(dest: Path, keyfile: Path, *, root: Path, target: PythonTarget,
                  source: WheelSource, python: str | None, rebuild: bool, log: Log) -> bool:
    """Fill dest with the dependency wheels and node-requirements.txt; True
    when the previous ones still hold."""
    excludes = parse_excludes((root / "compose" / "node-excludes.txt").read_text())
    requirements = node_requirements((root / "pyproject.toml").read_text(), excludes)
    key = deps_key(requirements=requirements, target=target, source=source)
    if not rebuild and dest.is_dir() and keyfile.is_file() and keyfile.read_text() == key:
        log("dependency wheels: reused (the node's requirements are unchanged)")
        return True
    fresh = dest.with_name(dest.name + ".partial")
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(parents=True)
    reqs = fresh / "node-requirements.txt"
    reqs.write_text(
        "# Generated by `dlab image build`: pyproject.toml's dependencies minus\n"
        "# compose/node-excludes.txt.\n" + "".join(f"{req}\n" for req in requirements))
    log(f"dependency wheels: building for {len(requirements)} requirements ({source.value})")
    if source is WheelSource.HOST:
        assert python is not None
        _pip(python, "wheel", "--quiet", "--prefer-binary", "--wheel-dir", str(fresh),
             "pip", "-r", str(reqs))
    else:
        _download_for(target, requirements, fresh, log=log)
    if not list(fresh.glob("pip-*.whl")):
        raise ImageBuildError("no pip wheel among the dependency wheels")
    _replace_dir(dest, fresh)
    keyfile.write_text(key)
    return False


def _download_for(target: PythonTarget, requirements: list[str], dest: Path, *, log: Log
                  ) -> None:
    """Binary wheels for the image's Python; a requirement with no wheel for
    it comes as an sdist (no deps of its own resolved: list them in pyproject)
    plus setuptools and wheel, so pip builds it inside the image, offline."""
    abi = f"cp{target.version[0]}{target.version[1]}"
    flags = ["--only-binary=:all:", "--python-version", target.python_version,
             "--implementation", "cp", "--abi", abi, "--abi", "abi3", "--abi", "none",
             *(arg for tag in target.platform_tags() for arg in ("--platform", tag))]
    python = sys.executable
    sdist_only: list[str] = []
    for req in requirements:
        try:
            _pip(python, "download", "--quiet", "--no-deps", "--dest", str(dest), *flags, req)
        except ImageBuildError:
            sdist_only.append(req)
    binary = [req for req in requirements if req not in sdist_only]
    extra = ["setuptools", "wheel"] if sdist_only else []
    _pip(python, "download", "--quiet", "--dest", str(dest), *flags, "pip", *extra, *binary)
    if sdist_only:
        log(f"no wheel for Python {target.python_version} {target.machine}: "
            f"{', '.join(sdist_only)}; pip builds them inside the image")
        _pip(python, "download", "--quiet", "--no-deps", "--no-binary=:all:", "--dest",
             str(dest), *sdist_only)


def project_files(root: Path) -> list[Path]:
    """What the project wheel is built from (and its cache key covers)."""
    files = [root / "pyproject.toml"]
    files += [root / name for name in ("README.md", "LICENSE") if (root / name).is_file()]
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*")):
            rel = path.relative_to(root)
            if (path.is_file() and "__pycache__" not in rel.parts
                    and not any(part.startswith(".") for part in rel.parts)
                    and path.suffix not in {".pyc", ".pyo"}):
                files.append(path)
    return files


def _prepare_project(dest: Path, keyfile: Path, *, root: Path, rebuild: bool, log: Log) -> bool:
    """The project wheel, built from a copy of the sources (the shared tree
    is left alone); True when the sources are unchanged since the last one."""
    files = project_files(root)
    key = digest(part for path in files
                 for part in (str(path.relative_to(root)), path.read_bytes()))
    if (not rebuild and keyfile.is_file() and keyfile.read_text() == key
            and list(dest.glob("*.whl"))):
        log("project wheel: reused (sources unchanged)")
        return True
    log("project wheel: building")
    staging = dest.with_name("project.src")
    fresh = dest.with_name(dest.name + ".partial")
    for scratch in (staging, fresh):
        shutil.rmtree(scratch, ignore_errors=True)
    for path in files:
        target = staging / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    # Without build isolation when this Python has setuptools: no index needed.
    isolation: list[str] = []
    with contextlib.suppress(ImportError):
        import setuptools  # noqa: F401

        isolation = ["--no-build-isolation"]
    _pip(sys.executable, "wheel", "--quiet", "--no-deps", *isolation, "--wheel-dir", str(fresh),
         str(staging), env={"SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH})
    shutil.rmtree(staging)
    _replace_dir(dest, fresh)
    keyfile.write_text(key)
    return False


def _docker_build(client: docker.DockerClient, context: Path, *, base: str, tag: str,
                  nocache: bool, log: Log) -> tuple[str, list[str]]:
    """Classic-builder build with networking off: proof that it is offline.
    Removes the image the tag held before when nothing else uses it."""
    from docker.errors import APIError, ImageNotFound

    before: str | None = None
    with contextlib.suppress(ImageNotFound):
        before = client.images.get(tag).id
    output: list[str] = []
    chunks: Iterable[dict[str, Any]] = client.api.build(
        path=str(context), tag=tag, buildargs={"BASE_IMAGE": base}, network_mode="none",
        pull=False, nocache=nocache, rm=True, forcerm=True, decode=True)
    for chunk in chunks:
        if "error" in chunk:
            tail = "\n".join(output[-15:])
            raise ImageBuildError(f"docker build failed: {chunk['error'].strip()}\n{tail}")
        # The classic builder colours a RUN step's stderr with ANSI escapes.
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(chunk.get("stream", "")))
        for line in text.splitlines():
            if line.strip():
                output.append(line.rstrip())
                log(line.rstrip())
    image_id: str = client.images.get(tag).id
    if before is not None and before != image_id:
        with contextlib.suppress(APIError):  # in use by a container, or tagged elsewhere
            client.images.remove(before, noprune=False)
    return image_id, output
