"""The VM's side of the ``cmd:`` bridge (kvconform.testbeds.rdma_vm.bridge, which says why): listen on the
forwarded port, and fork the reference initiator on the device per connection, its stdin and stdout on the socket.

    python -m kvconform.testbeds.rdma_vm.bridge_agent --host 10.0.2.15 --port 18516 --device roce=rxe1 \\
        --device iwarp=siw1
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
from typing import Any

from kvconform.components.kbtp import serve_kbtp_initiator
from kvconform.rdma.verbs.device import pyverbs
from kvconform.testbeds.rdma_vm.bridge import CHILD_BOUND_S, SCHEMES, initiator_argv, read_header


def _child(conn: socket.socket, listener: socket.socket, devices: dict[str, str], serve: Any) -> int:
    """In the forked child: the socket becomes stdin and stdout, then the initiator runs to its end."""
    listener.close()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.alarm(CHILD_BOUND_S)  # a bound on the whole initiator, whatever it waits for
    try:
        argv = initiator_argv(read_header(conn), devices)
    except ValueError as exc:
        conn.sendall(json.dumps({"id": 0, "error": f"bridge: {exc}"}).encode() + b"\n")
        print(f"bridge: {exc}", file=sys.stderr, flush=True)
        return 2
    os.dup2(conn.fileno(), 0)
    os.dup2(conn.fileno(), 1)
    conn.close()
    print(f"bridge: initiator {' '.join(argv)}", file=sys.stderr, flush=True)
    return int(serve(argv))


def agent(host: str, port: int, devices: dict[str, str]) -> int:
    """Listen on ``host:port``; fork one reference initiator per connection. Runs until SIGTERM."""
    if set(devices.values()) != {"wire"}:  # loaded once here, not in each forked initiator (one TCG vCPU)
        pyverbs()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the initiators
    listener = socket.create_server((host, port))
    print(f"listening on {host}:{listener.getsockname()[1]} ({', '.join(f'{w}={d}' for w, d in devices.items())})",
          flush=True)
    while True:
        conn, _ = listener.accept()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(conn, listener, devices, serve_kbtp_initiator)
            finally:
                sys.stdout.flush()
                os._exit(code)
        conn.close()


def _devices(specs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for spec in specs:
        wire, sep, device = spec.partition("=")
        if not sep or wire not in SCHEMES.values() or not device:
            raise argparse.ArgumentTypeError(f"--device {spec!r}: expected roce=DEV or iwarp=DEV")
        out[wire] = device
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvconform.testbeds.rdma_vm.bridge_agent",
                                description="in the VM: fork a reference initiator on a device per connection")
    p.add_argument("--host", required=True, help="the address to listen on (the VM's user-mode NIC: 10.0.2.15)")
    p.add_argument("--port", type=int, required=True, help="0 picks a free one")
    p.add_argument("--device", action="append", default=[],
                   help="WIRE=DEV: roce=rxe1, iwarp=siw1 (repeatable; DEV 'wire': the userspace binding, no device)")
    args = p.parse_args(argv)
    try:
        return agent(args.host, args.port, _devices(args.device))
    except (ValueError, OSError, argparse.ArgumentTypeError) as exc:
        print(f"bridge agent: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
