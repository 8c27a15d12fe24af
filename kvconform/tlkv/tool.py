"""``kvconform tlkv ...``: the reference TLKV writer, reader and prefill side as processes.

The harness's ``cmd:`` drivers spawn these exactly as they spawn a third-party implementation:

    kvconform tlkv export  --sequence SEQ.json --out ENVELOPE
    kvconform tlkv import  --envelope ENVELOPE --pool B,L,Hkv,D --versions 1,2 --out RESULT.json
    kvconform tlkv prefill --decode HOST:PORT --sequence SEQ.json [--timeout S]

``import`` writes RESULT.json: ``{"status": "ok"|"format"|"shape"|"version", "requirement": id|null,
"message": str, "version": int|null, "blocks": [{"block_hash", "n_tokens"}], "kv_file": path|null,
"allocated": int}`` (``allocated``: the blocks this process's pool holds when it exits, 0 for a rejected
envelope: every rule is checked before anything is allocated);
when ok, ``kv_file`` names ``<RESULT stem>.kv.f32``, written beside RESULT.json (the name is relative
to RESULT.json's folder), holding the decoded values as little-endian
float32 [n_blocks][L][2][Hkv][B][D].  ``prefill`` prints one JSON line with the outcome.

Exit codes: 0 success; 1 the envelope was rejected (import) or the push did not end OK (prefill);
2 bad usage or unreadable input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any

import numpy as np

from kvconform.tlkv.content import read_sequence
from kvconform.tlkv.envelope import EncodeError, encode_sequence
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.grpc_client import CallFailed
from kvconform.tlkv.prefill import run_prefill
from kvconform.tlkv.reader import EnvelopeError, read_envelope


def parse_versions(text: str) -> frozenset[int]:
    """ "1,2" -> {1, 2}; only 1 and 2 exist."""
    try:
        versions = frozenset(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"versions: got {text!r}, expected a comma list of 1 and 2") from None
    if not versions or not versions <= {1, 2}:
        raise argparse.ArgumentTypeError(f"versions: got {text!r}, expected a comma list of 1 and 2")
    return versions


def parse_geometry(text: str) -> Geometry:
    try:
        return Geometry.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _export(args: argparse.Namespace) -> int:
    seq = read_sequence(args.sequence)
    envelope = encode_sequence(seq.geometry, seq.version, seq.tokens, seq.kv)
    Path(args.out).write_bytes(envelope)
    print(f"wrote {args.out}: {len(envelope)} bytes, {seq.n_blocks} blocks, v{seq.version}")
    return 0


def _import(args: argparse.Namespace) -> int:
    data = Path(args.envelope).read_bytes()
    out = Path(args.out)
    result: dict[str, Any] = {"status": "ok", "requirement": None, "message": "", "version": None,
                              "blocks": [], "kv_file": None, "allocated": 0}
    try:
        env = read_envelope(data, geometry=args.pool, versions=args.versions)
    except EnvelopeError as exc:
        result.update(status=exc.kind, requirement=exc.requirement, message=str(exc))
    else:
        n = len(env.records)
        values = np.empty((n, *args.pool.kv_shape), dtype="<f4")
        for i in range(n):
            values[i] = env.kv(i)
        kv_path = out.with_name(f"{out.stem}.kv.f32")
        kv_path.write_bytes(values.tobytes())
        result.update(message=f"{n} blocks, {len(data)} bytes", version=env.version, kv_file=kv_path.name,
                      allocated=n, blocks=[{"block_hash": r.block_hash, "n_tokens": r.n_tokens} for r in env.records])
    out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["status"] == "ok" else 1


def _prefill(args: argparse.Namespace) -> int:
    seq = read_sequence(args.sequence)
    try:
        run = run_prefill(args.decode, seq.tokens, seq.kv, seq.geometry, seq.version, seq.request_id,
                          timeout=args.timeout)
    except CallFailed as exc:
        print(json.dumps({"status": exc.status_name, "details": exc.details, "method": exc.method}))
        print(f"kvconform tlkv prefill: {exc}", file=sys.stderr)
        return 1
    response = run.response
    print(json.dumps({
        "status": run.outcome.status_name, "details": run.outcome.details, "held": run.held,
        "blocks_stored": response.blocks_stored if response is not None else None,
        "blocks_reused": response.blocks_reused if response is not None else None,
        "payload_bytes": response.payload_bytes if response is not None else None,
        "bytes_moved": run.bytes_moved,
    }))
    if not run.ok:
        print(f"kvconform tlkv prefill: PushKv ended {run.outcome.status_name}: {run.outcome.details}",
              file=sys.stderr)
    return 0 if run.ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvconform tlkv", description="TLKV reference writer, reader, prefill")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("export", help="write a sequence file as one envelope (checked encoder)")
    p.add_argument("--sequence", required=True, help="sequence JSON file (see kvconform.tlkv.content)")
    p.add_argument("--out", required=True, help="envelope file to write")
    p.set_defaults(run=_export)
    p = sub.add_parser("import", help="read an envelope into a pool and write the result JSON")
    p.add_argument("--envelope", required=True)
    p.add_argument("--pool", required=True, type=parse_geometry, help="B,L,Hkv,D of the receiving pool")
    p.add_argument("--versions", type=parse_versions, default=frozenset({1, 2}), help="readable versions, e.g. 1,2")
    p.add_argument("--out", required=True, help="result JSON file to write")
    p.set_defaults(run=_import)
    p = sub.add_parser("prefill", help="push a sequence to a decode side over tl.kv.v1")
    p.add_argument("--decode", required=True, help="HOST:PORT of the decode side")
    p.add_argument("--sequence", required=True)
    p.add_argument("--timeout", type=float, default=30.0, help="deadline of each RPC in seconds")
    p.set_defaults(run=_prefill)
    return parser


def main(argv: Seq[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help and on bad usage; main() returns instead
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return int(args.run(args))
    except (OSError, ValueError, EncodeError, KeyError) as exc:
        print(f"kvconform tlkv {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
