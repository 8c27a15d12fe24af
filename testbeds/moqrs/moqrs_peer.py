"""moq-rs (PyPI ``moq-rs``, the Python binding of moq-dev/moq's Rust crates) as kvconform's second MOQT peer.

Run by the interpreter of the dedicated environment ``.venv-moqrs`` (``.ci/interop prepare`` makes it; it holds
moq-rs and nothing of kvconform, so this file imports only moq-rs and the standard library). Three roles:

    relay       moq.Server on 127.0.0.1:PORT with a generated self-signed certificate (or --cert/--key): it
                fans out and caches whatever sessions publish; prints ``listening on 127.0.0.1:PORT``
    publisher   moq.Client to --relay: one broadcast (--namespace, fields joined by '/') with one track
                (--track): --groups groups of --objects frames, frame payload ``g<group>o<object>`` padded to
                --size octets, one group every --interval s; prints ``group <n>`` per group, then
                ``published <groups> groups``, and stays until SIGTERM/--linger
    subscriber  moq.Client to --relay: subscribes to --namespace/--track and prints one line
                ``object <group> <index> <len> <sha256-prefix>`` per frame of the next --groups groups, then ``done``

moq-rs offers moq-lite and moqt-15..22 at session setup and picks by ALPN; the harness offers moqt-22 only.
Every wait is bounded; the process ends on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import signal
import sys

import moq  # type: ignore[import-not-found,unused-ignore]  # in .venv-moqrs, not in kvconform's environment


def _payload(group: int, obj: int, size: int) -> bytes:
    head = f"g{group}o{obj}".encode()
    return head + b"." * max(size - len(head), 0)


async def _until_term(linger: float) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(TimeoutError):  # --linger bounds its life
        await asyncio.wait_for(stop.wait(), linger)


async def relay(args: argparse.Namespace) -> None:
    tls = {"tls_cert": [args.cert], "tls_key": [args.key]} if args.cert else {"tls_generate": ["localhost"]}
    async with moq.Server(f"127.0.0.1:{args.port}", **tls) as server:
        print(f"listening on {server.local_addr}", flush=True)
        serving = asyncio.create_task(server.serve())
        await _until_term(args.linger)
        serving.cancel()


async def publisher(args: argparse.Namespace) -> None:
    async with moq.Client(args.relay, tls_verify=False, reconnect=False, websocket_enabled=False) as client:
        broadcast = client.create_broadcast(args.namespace)
        track = broadcast.publish_track(args.track)
        broadcast.announce()
        for _ in range(args.groups):
            group = track.append_group()
            for o in range(args.objects):
                group.write_frame(_payload(group.sequence, o, args.size))
            group.finish()
            print(f"group {group.sequence}", flush=True)
            await asyncio.sleep(args.interval)  # the pace of a live source (a subscriber joins mid-track)
        print(f"published {args.groups} groups", flush=True)
        await _until_term(args.linger)


async def subscriber(args: argparse.Namespace) -> None:
    async with moq.Client(args.relay, tls_verify=False, reconnect=False, websocket_enabled=False) as client:
        # announced_broadcast waits for the relay's NAMESPACE (request_broadcast fails at once when nothing is
        # announced yet: a SUBSCRIBE_NAMESPACE answer takes a round trip)
        broadcast = await asyncio.wait_for(client.announced_broadcast(args.namespace).available(), args.timeout)
        track = await asyncio.wait_for(broadcast.subscribe_track(args.track), args.timeout)
        print("subscribed", flush=True)
        for _ in range(args.groups):
            group = await asyncio.wait_for(track.next_group(), args.timeout)
            if group is None:
                print("track ended", flush=True)
                return
            index = 0
            while (frame := await asyncio.wait_for(group.read_frame(), args.timeout)) is not None:
                data = bytes(frame.payload)
                print(f"object {group.sequence} {index} {len(data)} {hashlib.sha256(data).hexdigest()[:16]}",
                      flush=True)
                index += 1
        print("done", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moqrs_peer", description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["relay", "publisher", "subscriber"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--relay", help="moqt://127.0.0.1:PORT")
    parser.add_argument("--namespace", default="moqrs/interop")
    parser.add_argument("--track", default="t")
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--objects", type=int, default=4)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.1, help="publisher: seconds between groups")
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--linger", type=float, default=600.0, help="the longest it runs (s)")
    parser.add_argument("--log", default="", help="moq-rs's Rust log level (error, warn, info, debug, trace)")
    args = parser.parse_args(argv)
    if args.log:
        moq.log_level(args.log)
    asyncio.run({"relay": relay, "publisher": publisher, "subscriber": subscriber}[args.role](args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
