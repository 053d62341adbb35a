"""`dlab image build`: its options and output. The build itself is
cluster/backends/image.py."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cluster.backends.docker_engine import EngineUnavailableError
from cluster.backends.image import (
    DEFAULT_BASE_IMAGE,
    LOCAL_BASE_IMAGE,
    NODE_IMAGE,
    ImageBuildError,
    WheelSource,
    build_node_image,
)
from store.tools.cli_args import UserError


def register(subparsers: Any, bench_subparsers: Any) -> None:
    image = subparsers.add_parser(
        "image", help="build the node image (offline: no registry needed)",
        description="Container images for the compose backend.")
    sub = image.add_subparsers(dest="image_command", metavar="ACTION", required=True)
    build = sub.add_parser(
        "build", help="build the node image from this checkout",
        description="Build the node image from this checkout with no network: wheels are "
        "made on the host; where the default base image cannot be pulled, a local one is "
        "made with debootstrap (compose/make-base-image.sh). A second build reuses the base "
        "image, the wheels and Docker's layer cache.")
    build.add_argument("--base-image", metavar="IMAGE",
                       help=f"base image with python3 >= 3.11 (default: {DEFAULT_BASE_IMAGE} "
                       f"if present or pullable, else {LOCAL_BASE_IMAGE}, made if absent)")
    build.add_argument("--tag", default=NODE_IMAGE, help="name of the node image (default: "
                       "%(default)s)")
    build.add_argument("--rebuild", action="store_true",
                       help="reuse nothing: remake the local base image, the wheels and "
                       "every layer")
    build.add_argument("--wheels", type=WheelSource, choices=list(WheelSource),
                       default=WheelSource.AUTO,
                       help="how dependency wheels are made: `host` builds them with a host "
                       "Python of the image's version, `download` fetches binaries for the "
                       "image's Python; `auto` (default) uses host when it can")
    build.add_argument("-v", "--verbose", action="store_true",
                       help="show docker build's output")
    build.set_defaults(handler=_cmd_build)


def _cmd_build(args: argparse.Namespace) -> int:
    def log(line: str) -> None:
        print(f"dlab image: {line}", file=sys.stderr)

    def build_log(line: str) -> None:
        if args.verbose:
            print(line, file=sys.stderr)

    try:
        result = build_node_image(tag=args.tag, base_image=args.base_image,
                                  rebuild=args.rebuild, wheels=args.wheels, log=log,
                                  build_log=build_log)
    except (EngineUnavailableError, ImageBuildError) as exc:
        raise UserError(str(exc)) from exc
    s = result.seconds
    print(f"{result.tag} {result.image_id}")
    print(f"  base {result.base_image} ({result.base_how}); wheels by "
          f"{result.wheel_source.value}: dependencies "
          f"{'reused' if result.deps_reused else 'built'}, project "
          f"{'reused' if result.project_reused else 'built'}; "
          f"{result.steps_cached}/{result.steps} steps from cache")
    print(f"  {s['total']:.1f} s (base {s['base']:.1f} s, wheels {s['wheels']:.1f} s, "
          f"build {s['build']:.1f} s)")
    return 0
