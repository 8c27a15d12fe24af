"""Regenerate the tl.kv.v1 protobuf modules from ``tl_kv_v1.proto``.

Writes ``tl_kv_v1_pb2.py`` and ``tl_kv_v1_pb2.pyi`` beside this file with grpcio-tools' protoc.
No ``_pb2_grpc.py`` is generated on purpose: the server and client register their handlers by
hand so the client can also send raw, malformed bytes.

    python -m kvconform.tlkv.proto.generate           # rewrite the committed files
    python -m kvconform.tlkv.proto.generate --check   # exit 1 when they differ from a fresh run
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = "tl_kv_v1.proto"
OUTPUTS = ("tl_kv_v1_pb2.py", "tl_kv_v1_pb2.pyi")


def generate(out_dir: Path) -> list[Path]:
    """Run protoc on the committed .proto, writing the pb2 module and stub into ``out_dir``."""
    from grpc_tools import protoc  # type: ignore[import-untyped]  # optional: the test extra (no stubs)

    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{HERE}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        str(HERE / PROTO),
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc exited with {rc} for {HERE / PROTO}")
    return [out_dir / name for name in OUTPUTS]


_VERSION_STAMP = re.compile(
    r"# Protobuf Python Version: [^\n]*\n|_runtime_version\.ValidateProtobufRuntimeVersion\([^)]*\)\n")


def _content(path: Path) -> str:
    """The generated code without the protobuf version it was generated with: a newer grpcio-tools
    stamps another version on the same code, which is not staleness."""
    return _VERSION_STAMP.sub("", path.read_text())


def stale_outputs() -> list[str]:
    """Names of the committed outputs that differ from (or are missing next to) a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        return [
            path.name
            for path in fresh
            if not (HERE / path.name).is_file() or _content(HERE / path.name) != _content(path)
        ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_outputs()
        for name in stale:
            print(f"stale: {HERE / name}", file=sys.stderr)
        return 1 if stale else 0
    for path in generate(HERE):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
