"""Generate the Python modules for the .proto files in this directory.

    python -m proto.generate            # rewrite proto/*_pb2*.py(i) in place
    python -m proto.generate --out DIR  # write DIR/proto/... instead

Protos are compiled from the repository root with `-I.` so the generated
gRPC modules import their messages as `from proto import x_pb2` (a package
import) instead of grpc_tools' default top-level `import x_pb2`.
tests/proto/test_proto_generated.py re-runs this into a temporary directory and
fails when the committed modules differ (edit a .proto, re-run this).
"""

from __future__ import annotations

import argparse
import os
import sys

PROTO_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(PROTO_DIR)
PROTOS = ["broker.proto", "controller.proto", "ha.proto"]


def generated_names() -> list[str]:
    names = []
    for p in PROTOS:
        stem = p.removesuffix(".proto")
        names += [f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py"]
    return names


def generate(out_root: str) -> list[str]:
    """Compile every proto into out_root/proto/; returns the files written."""
    from grpc_tools import protoc

    os.makedirs(os.path.join(out_root, "proto"), exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *[os.path.join(ROOT, "proto", p) for p in PROTOS],
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit code {rc}")
    return [os.path.join(out_root, "proto", n) for n in generated_names()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=ROOT, help="root to write proto/*.py under")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
