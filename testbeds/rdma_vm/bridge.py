"""The ``cmd:`` bridge into the testbed VM: the reference initiator on a VM's kernel device (rxe1, siw1) as the
``cmd:`` process of a kbtp-initiator run on the host, so that the harness's userspace target on a wire facing
the device judges what verbs cannot see (issue 23 item 7; docs/interop-rdma.md, "What is left for the initiators").

- ``agent`` runs in the VM (testbeds/rdma-vm/interop-serve.sh) on a forwarded TCP port. It imports the initiator
  once and forks one per connection, its stdin and stdout on the socket: a Python start per bed on the VM's one
  TCG vCPU would cost seconds each, and the direct-load race alone starts 16 to 40 beds. A connection's first line
  says what to dial (a JSON object: ``target``, ``initiator_id``, ``features``, optional ``profile``); the device
  is the one the agent serves for the URL's scheme (``--device roce=rxe1 --device iwarp=siw1``).
- ``relay`` is the host's ``cmd:`` command: it rewrites ``{target}``'s 127.0.0.1 to the address the VM reaches
  the host's loopback at (qemu's user-mode network: 10.0.2.2), sends that first line and carries the contract's
  lines both ways until either end closes::

    cmd:python -m kvconform.testbeds.rdma_vm.bridge relay --port P --target {target} \\
        --initiator-id {initiator_id} --features={features}

Both are bounded: a connection's header within HEADER_WAIT_S, a forked initiator within CHILD_BOUND_S (SIGALRM),
the relay's connect within CONNECT_S. Only the standard library is imported at module level (the relay starts
once per bed on the host).
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import socket
import sys
from typing import Any
from urllib.parse import urlsplit, urlunsplit

HOST_FROM_GUEST = "10.0.2.2"  # qemu's user-mode network: the host's 127.0.0.1 (testbeds/rdma_vm/vm.py)
HEADER_WAIT_S = 30.0
HEADER_MAX = 4096
CHILD_BOUND_S = 900  # one bed's initiator: far beyond any check's own bounds
CONNECT_S = 30.0
SCHEMES = {"kbtp+roce": "roce", "kbtp+iwarp": "iwarp"}


# ---- the VM's side ----------------------------------------------------------------------------------------


def initiator_argv(header: dict[str, Any], devices: dict[str, str]) -> list[str]:
    """The `kvconform serve kbtp-initiator` arguments for one connection's header; ValueError naming what is
    wrong (an unknown scheme, a wire this agent serves no device for, a field of the wrong type)."""
    target = header.get("target")
    if not isinstance(target, str):
        raise ValueError(f"header: 'target' must be a URL, got {target!r}")
    wire = SCHEMES.get(urlsplit(target).scheme)
    if wire is None or wire not in devices:
        raise ValueError(f"header: target {target!r}: this agent serves {', '.join(sorted(devices))} "
                         f"({', '.join(f'{w}={d}' for w, d in sorted(devices.items()))})")
    # "wire": the userspace binding of the scheme (the bridge tried on a host without RDMA devices)
    argv = ["--target", target] + ([] if devices[wire] == "wire" else ["--binding", "verbs", "--device", devices[wire]])
    for key, option in (("initiator_id", "--initiator-id"), ("features", "--features"), ("profile", "--profile")):
        value = header.get(key)
        if value is None or (key != "features" and value == ""):
            continue
        if not isinstance(value, str):
            raise ValueError(f"header: {key!r} must be a string, got {value!r}")
        argv.append(f"{option}={value}")
    return argv


def read_header(conn: socket.socket) -> dict[str, Any]:
    """The connection's first line, read octet by octet (what follows it is the initiator's stdin); ValueError
    when it is not a JSON object within HEADER_MAX octets and HEADER_WAIT_S seconds."""
    conn.settimeout(HEADER_WAIT_S)
    line = bytearray()
    while not line.endswith(b"\n"):
        try:
            got = conn.recv(1)
        except TimeoutError:
            raise ValueError(f"no header line within {HEADER_WAIT_S:g} s") from None
        if not got or len(line) >= HEADER_MAX:
            raise ValueError(f"no header line within {HEADER_MAX} octets before the end of the stream")
        line += got
    conn.settimeout(None)
    body = json.loads(bytes(line))
    if not isinstance(body, dict):
        raise ValueError(f"header: a JSON object expected, got {body!r}")
    return body


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
    # lazy: the relay on the host imports this module too, and needs none of the initiator's imports
    from kvconform.components.kbtp import serve_kbtp_initiator
    # lazy: imported once here so that each forked initiator starts with pyverbs already loaded (one TCG vCPU)
    from kvconform.rdma.verbs.device import pyverbs

    if set(devices.values()) != {"wire"}:
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


# ---- the host's side --------------------------------------------------------------------------------------


def guest_url(target: str, host_from_guest: str = HOST_FROM_GUEST) -> str:
    """``target`` as the VM dials it: the host's 127.0.0.1 is ``host_from_guest`` there (ports unchanged)."""
    parts = urlsplit(target)
    if parts.hostname != "127.0.0.1" or parts.port is None:
        raise ValueError(f"--target {target!r}: a harness target on 127.0.0.1:PORT expected")
    return urlunsplit(parts._replace(netloc=f"{host_from_guest}:{parts.port}"))


def relay(port: int, header: dict[str, Any]) -> int:
    """Connect to the agent's forwarded port, send the header, then carry stdin to it and its answers to stdout."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=CONNECT_S)
    sock.settimeout(None)
    sock.sendall(json.dumps(header).encode() + b"\n")
    sel = selectors.DefaultSelector()
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    sel.register(stdin, selectors.EVENT_READ)
    sel.register(sock, selectors.EVENT_READ)
    try:
        while True:
            for key, _ in sel.select():  # unbounded by design: the harness stops this process (Process.stop)
                if key.fileobj == stdin:
                    data = os.read(stdin, 1 << 16)
                    if data:
                        sock.sendall(data)
                    else:  # the harness closed our stdin: the initiator's stdin ends too, its answers still come
                        sel.unregister(stdin)
                        sock.shutdown(socket.SHUT_WR)
                else:
                    data = sock.recv(1 << 16)
                    if not data:
                        return 0
                    os.write(stdout, data)
    finally:
        sel.close()
        sock.close()


def _devices(specs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for spec in specs:
        wire, sep, device = spec.partition("=")
        if not sep or wire not in SCHEMES.values() or not device:
            raise argparse.ArgumentTypeError(f"--device {spec!r}: expected roce=DEV or iwarp=DEV")
        out[wire] = device
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvconform.testbeds.rdma_vm.bridge", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="side", required=True)
    a = sub.add_parser("agent", help="in the VM: fork a reference initiator on a device per connection")
    a.add_argument("--host", required=True, help="the address to listen on (the VM's user-mode NIC: 10.0.2.15)")
    a.add_argument("--port", type=int, required=True)
    a.add_argument("--device", action="append", default=[], help="WIRE=DEV: roce=rxe1, iwarp=siw1 (repeatable; DEV 'wire': the userspace "
                        "binding, no device)")
    r = sub.add_parser("relay", help="on the host: the cmd: command relaying the contract to the agent")
    r.add_argument("--port", type=int, required=True, help="the host's 127.0.0.1 port forwarded to the agent")
    r.add_argument("--target", required=True, help="{target}: the harness target's URL on 127.0.0.1")
    r.add_argument("--initiator-id", default=None)
    r.add_argument("--features", default=None)
    r.add_argument("--profile", default=None)
    r.add_argument("--host-from-guest", default=HOST_FROM_GUEST, help=f"default {HOST_FROM_GUEST} (qemu user net)")
    args = p.parse_args(argv)
    try:
        if args.side == "agent":
            return agent(args.host, args.port, _devices(args.device))
        header = {"target": guest_url(args.target, args.host_from_guest), "initiator_id": args.initiator_id,
                  "features": args.features, "profile": args.profile}
        return relay(args.port, header)
    except (ValueError, OSError, argparse.ArgumentTypeError) as exc:
        print(f"bridge {args.side}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
