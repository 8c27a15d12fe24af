"""An independent TLKV v1 writer, written from the seed text alone (it imports nothing of kvconform), with the
process habits of real tools that a correct writer may have and the harness must survive:

    python writer.py --sequence SEQ.json --out ENVELOPE [--habit HABIT]

HABIT (default none), each around a correct export:
  stderr-garbage      writes bytes that are not UTF-8 to stderr
  child-holds-stdout  leaves a child behind that keeps stdout and stderr open for 10 minutes
  forks               leaves three children behind, sleeping
  daemonises          leaves a grandchild behind in a session of its own (double fork, setsid)
  ignores-sigterm     leaves a child behind that ignores SIGTERM
and two that are not correct, to be stopped by the harness:
  hangs               never writes the envelope, sleeping for 10 minutes
  hangs-ignoring-sigterm  the same, ignoring SIGTERM
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import struct
import sys
import time
from array import array
from pathlib import Path

import crc32c

FNV_OFFSET, FNV_PRIME, MASK = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1


def fnv1a64(data: bytes) -> int:
    h = FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & MASK
    return h


def block_hash(parent: int, toks: list[int]) -> int:
    """H(parent, toks): fnv1a64 of le_u64(parent) and each le_u32 token, a result of 0 replaced by 1."""
    return fnv1a64(struct.pack("<Q", parent) + b"".join(struct.pack("<I", t) for t in toks)) or 1


def export(seq_path: Path) -> bytes:
    seq = json.loads(seq_path.read_text())
    if seq["version"] != 1:
        raise SystemExit(f"writer.py writes v1 only, asked for v{seq['version']}")
    g = seq["geometry"]
    b, n_layers, hkv, d = g["block_tokens"], g["n_layers"], g["n_kv_heads"], g["head_dim"]
    tokens = seq["tokens"]
    n_blocks = -(-len(tokens) // b)
    values = array("H")  # raw f16 bits, [n_blocks][L][2][Hkv][B][D]
    values.frombytes((seq_path.parent / seq["kv_file"]).read_bytes())
    if sys.byteorder != "little":
        values.byteswap()
    per_block = n_layers * 2 * hkv * b * d
    body = bytearray(struct.pack("<4sHHIIIII", b"TLKV", 1, 1, n_blocks, b, n_layers, hkv, d))
    parent = 0
    for i in range(n_blocks):
        toks = tokens[i * b : (i + 1) * b]
        fill = len(toks)
        if fill == b:
            parent = block_hash(parent, toks)
        body += struct.pack("<QI", parent if fill == b else 0, fill)
        block = values[i * per_block : (i + 1) * per_block]
        for row in range(n_layers * 2 * hkv):  # positions at or past n_tokens are zero bytes
            for pos in range(fill, b):
                start = (row * b + pos) * d
                block[start : start + d] = array("H", [0] * d)
        body += block.tobytes() if sys.byteorder == "little" else _swapped(block)
    return bytes(body) + struct.pack("<I", crc32c.crc32c(bytes(body)))


def _swapped(block: array[int]) -> bytes:
    copy = array("H", block)
    copy.byteswap()
    return copy.tobytes()


def _leave_child(ignore_term: bool = False) -> None:
    if os.fork() == 0:
        if ignore_term:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(600)
        os._exit(0)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequence", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--habit", default="none")
    args = parser.parse_args()
    habit = args.habit
    if habit.startswith("hangs"):
        if habit == "hangs-ignoring-sigterm":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(600)
    args.out.write_bytes(export(args.sequence))
    sys.stdout.flush()
    if habit == "stderr-garbage":
        sys.stderr.buffer.write(b"warning: \xff\xfe\xc3( is not UTF-8\n")
    elif habit == "child-holds-stdout":
        _leave_child()
    elif habit == "forks":
        for _ in range(3):
            _leave_child()
    elif habit == "ignores-sigterm":
        _leave_child(ignore_term=True)
    elif habit == "daemonises":
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(600)
            os._exit(0)
        os.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
