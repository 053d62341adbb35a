"""The one way this project reaches a Docker engine: `connect()` for commands
and backends, `unavailable_reason()` for tests that skip where no engine
answers.

The Docker SDK is imported here, lazily, so that `dlab` starts (and the node
image runs) without touching it. The client negotiates the API version with
the engine ("auto"): the SDK's default is newer than many installed engines
speak (Debian's docker.io 20.10 answers API 1.41).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import docker


class EngineUnavailableError(RuntimeError):
    """No Docker engine answers; the message says where it looked and what to do."""


def _where() -> str:
    return os.environ.get("DOCKER_HOST") or "the default socket (/var/run/docker.sock)"


def connect(*, timeout_s: float = 60.0) -> docker.DockerClient:
    """A client for the engine DOCKER_HOST (or the default socket) names,
    checked with a ping. Raises EngineUnavailableError."""
    try:
        import docker
        from docker.errors import DockerException
    except ModuleNotFoundError as exc:  # pragma: no cover - docker is a dependency
        raise EngineUnavailableError(
            "the Docker SDK for Python is not installed (pip install docker)"
        ) from exc
    try:
        client = docker.from_env(version="auto", timeout=int(timeout_s))
        client.ping()
    except (DockerException, OSError) as exc:
        raise EngineUnavailableError(
            f"no Docker engine answers at {_where()}: {_first_line(exc)}. "
            "Start dockerd (or set DOCKER_HOST) and check this user may use it."
        ) from exc
    return client


def unavailable_reason() -> str | None:
    """None when an engine answers; else why not, for pytest's skip reason."""
    try:
        connect(timeout_s=10).close()
    except EngineUnavailableError as exc:
        return str(exc)
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
