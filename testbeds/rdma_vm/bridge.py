"""The ``cmd:`` bridge into the testbed VM: the reference initiator on a VM's kernel device (rxe1, siw1) as the
``cmd:`` process of a kbtp-initiator run on the host, so that the harness's userspace target on a wire facing
the device judges what verbs cannot see (issue 23 item 7; docs/interop-rdma.md, "The initiators' facing wire in
the lane").

- the agent (kvconform.testbeds.rdma_vm.bridge_agent) runs in the VM (testbeds/rdma-vm/interop-serve.sh) on a
  forwarded TCP port. It imports the initiator once and forks one per connection, its stdin and stdout on the
  socket: a Python start per bed on the VM's one TCG vCPU would cost seconds each, and the direct-load race alone
  starts 16 to 40 beds. A connection's first line says what to dial (a JSON object: ``target``,
  ``initiator_id``, ``features``, optional ``profile``); the device is the one the agent serves for the URL's
  scheme (``--device roce=rxe1 --device iwarp=siw1``).
- the relay (this module, which imports only the standard library: it starts once per bed) is the host's
  ``cmd:`` command: it rewrites ``{target}``'s 127.0.0.1 to the address the VM reaches the host's loopback at
  (qemu's user-mode network: 10.0.2.2), sends that first line and carries the contract's lines both ways until
  either end closes::

    cmd:python -m kvconform.testbeds.rdma_vm.bridge relay --port P --target {target} \\
        --initiator-id {initiator_id} --features={features}

Both are bounded: a connection's header within HEADER_WAIT_S, a forked initiator within CHILD_BOUND_S (SIGALRM),
the relay's connect within CONNECT_S.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvconform.testbeds.rdma_vm.bridge",
                                description="on the host: the cmd: command relaying the contract to the VM's agent "
                                            "(kvconform.testbeds.rdma_vm.bridge_agent)")
    p.add_argument("side", choices=("relay",))
    p.add_argument("--port", type=int, required=True, help="the host's 127.0.0.1 port forwarded to the agent")
    p.add_argument("--target", required=True, help="{target}: the harness target's URL on 127.0.0.1")
    p.add_argument("--initiator-id", default=None)
    p.add_argument("--features", default=None)
    p.add_argument("--profile", default=None)
    p.add_argument("--host-from-guest", default=HOST_FROM_GUEST, help=f"default {HOST_FROM_GUEST} (qemu user net)")
    args = p.parse_args(argv)
    try:
        header = {"target": guest_url(args.target, args.host_from_guest), "initiator_id": args.initiator_id,
                  "features": args.features, "profile": args.profile}
        return relay(args.port, header)
    except (ValueError, OSError) as exc:
        print(f"bridge relay: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
