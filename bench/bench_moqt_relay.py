"""MOQT relay throughput on loopback: kvconform's relay and aiomoqt's relay, in the same run (issue 4).

    python bench/bench_moqt_relay.py [--seconds S] [--subscribers 1,8] [--object-size 32768] [--json FILE]
                                     [--ours-only] [--aioquic-baseline [--baseline-datagram-size N]]

One publisher and N subscribers (1 and 8) of one track through a relay on 127.0.0.1, objects of 32 KiB,
64 objects per group (one subgroup stream per group), publisher at full speed. The same clients drive
both relays: aiomoqt's bench publisher (moq-pub-bench, PUBLISH_NAMESPACE flow, so the relay subscribes
upstream) and subscriber (moq-sub-bench, counters only), each in the aiomoqt docker image with host
networking; N subscribers are N processes in one container. A subscriber counts what it received while
active; objects/s and MB/s (10^6 bytes) are summed over the subscribers (delivered by the relay), and the
ratio kvconform / aiomoqt is taken per N within the run. Each configuration runs twice per relay in the
order A B B A (A B C C B A with moq-rs) and the better run counts (a slow relay may still be draining when the
next starts).
Everything shares the machine's two cores, clients included, so the numbers are a same-run comparison,
not an absolute ceiling.

moq-rs's relay (testbeds/moqrs/moqrs_peer.py relay, from .venv-moqrs) is measured too when its environment is
there, with the same aiomoqt clients. `--ours-only` skips the third parties' relays (still aiomoqt's clients).
`--aioquic-baseline` adds a row with no MOQT at
all: plain aioquic, one sender and one receiver in ONE child process (one event loop, so one core does
the send and the receive of every byte, as a relay does), the same objects on one unidirectional stream
per group of 64, the sender keeping at most two groups unacknowledged; MB/s counts received stream
bytes. It tells how far the MOQT layers are from what aioquic itself does on this box. Its datagrams are
aioquic's default 1200 bytes unless `--baseline-datagram-size` says otherwise (kvconform's adapter uses
up to 16384 on loopback, capped by the peer's max_udp_payload_size: 1440 for the aiomoqt clients).

The figures, the profiles behind them and what was changed for them (issue 24 item 6: events taken in
runs, no pacing on loopback, 4 MiB server socket buffers, batched reads, UDP GSO sends) are in
docs/interop-aiomoqt.md, section Benchmark. To profile the relay under this load, run it yourself under a
sampling profiler (e.g. `py-spy record -- python -m kvconform serve moqt-relay --host 127.0.0.1 --port P
--policy open`) and drive it with `measure(testbed, RelayEndpoint("kvconform", P), n, 32768, seconds)`.

Not a test: nothing asserts. Needs docker and the images of testbeds/aiomoqt.yaml (.ci/interop makes them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests.interop` when run as a script

from kvconform.moqt.quic import quic_configuration
from kvconform.targets import docker as dk
from kvconform.targets.spec import parse_target
from kvconform.targets.testbed import Testbed
from kvconform.verdicts import TargetUnavailable
from tests.interop.moqrs_peers import moqrs_problem, moqrs_relay, moqrs_testbed
from tests.interop.peers import (
    CLIENT_TARGET,
    RelayEndpoint,
    aiomoqt_relay,
    aiomoqt_testbed,
    our_relay,
)

GROUP_SIZE = 64
_RESULT = re.compile(r"\((?P<active>[\d.]+)s active.*?Objects:\s+(?P<objects>[\d,]+).*?Bytes:\s+(?P<bytes>[\d,]+)",
                     re.S)


@dataclass
class Row:
    """One measurement: a relay, N subscribers, totals over the subscribers."""

    relay: str
    subscribers: int
    object_size: int
    seconds: float
    objects_per_s: float
    mb_per_s: float
    per_subscriber_mb_per_s: list[float]


def _image(testbed: Testbed) -> str:
    return parse_target(CLIENT_TARGET, testbed).value


def measure(testbed: Testbed, relay: RelayEndpoint, subscribers: int, object_size: int, seconds: float) -> Row:
    """One publisher and ``subscribers`` subscribers through ``relay`` for ``seconds``."""
    image = _image(testbed)
    ns, track = f"bench-{relay.name}-{subscribers}-{secrets.token_hex(3)}", "t"
    publisher = dk.ContainerSpec(
        image=image,
        command=["moq-pub-bench", relay.url, "--draft", "22", "-k", "--pub-ns", "-N", ns, "-T", track,
                 "-s", str(object_size), "-g", str(GROUP_SIZE), "-t", str(int(seconds) + 30), "--no-stats"],
        ready=dk.Readiness(log_pattern="waiting for subscriber", timeout_s=30.0),
    )
    one_sub = (f"moq-sub-bench {relay.url} --draft 22 -k -N {ns} -T {track} -t {seconds:g} --no-stats "
               f"-i {seconds:g}")
    script = (f"for i in $(seq {subscribers}); do timeout {seconds + 30:g} {one_sub} >/tmp/sub$i.log 2>&1 & done; "
              f"wait; cat /tmp/sub*.log")
    with dk.running(publisher):
        result = dk.run_to_completion(dk.ContainerSpec(image=image, command=["sh", "-c", script]),
                                      timeout_s=seconds + 60)
    found = [(float(m["active"]), int(m["objects"].replace(",", "")), int(m["bytes"].replace(",", "")))
             for m in _RESULT.finditer(result.stdout)]
    if len(found) != subscribers:
        raise RuntimeError(f"{relay.name}, {subscribers} subscriber(s): {len(found)} result block(s) in the "
                           f"subscribers' output; tail:\n{result.stdout[-2000:]}")
    objects_per_s = sum(objs / active for active, objs, _ in found if active > 0)
    per_sub = [nbytes / active / 1e6 for active, _, nbytes in found if active > 0]
    return Row(relay.name, subscribers, object_size, seconds, round(objects_per_s, 1), round(sum(per_sub), 2),
               [round(x, 2) for x in per_sub])


@contextlib.contextmanager
def relays_under_test(testbed: Testbed, *, ours_only: bool = False) -> Iterator[list[RelayEndpoint]]:
    """Our relay, aiomoqt's and moq-rs's, running at once for the whole run. Ours is skipped, with the reason,
    when it cannot start; moq-rs's when its environment is missing (.ci/interop prepare makes .venv-moqrs);
    the third parties' with ``ours_only``."""
    with contextlib.ExitStack() as stack:
        relays: list[RelayEndpoint] = []
        try:
            relays.append(stack.enter_context(our_relay(testbed)))
        except TargetUnavailable as exc:
            print(f"kvconform relay not measured: {exc}", file=sys.stderr)
        if not ours_only:
            relays.append(stack.enter_context(aiomoqt_relay(testbed)))
            problem = moqrs_problem()
            if problem:
                print(f"moq-rs relay not measured: {problem}", file=sys.stderr)
            else:
                relays.append(stack.enter_context(moqrs_relay(moqrs_testbed())))
        yield relays


async def _aioquic_pair(seconds: float, object_size: int, datagram_size: int = 1200) -> tuple[float, int]:
    """Plain aioquic on loopback, both ends in this loop: (seconds measured, stream bytes received)."""
    from aioquic.asyncio.client import connect
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.asyncio.server import serve
    from aioquic.quic.events import QuicEvent, StreamDataReceived

    received = [0]

    class Receiver(QuicConnectionProtocol):
        def quic_event_received(self, event: QuicEvent) -> None:
            if isinstance(event, StreamDataReceived):
                received[0] += len(event.data)

    alpn = ("bench",)
    server_config = quic_configuration(is_client=False, alpn=alpn)
    client_config = quic_configuration(is_client=True, alpn=alpn)
    server_config.max_datagram_size = client_config.max_datagram_size = datagram_size
    server = await serve("127.0.0.1", 0, configuration=server_config, create_protocol=Receiver)
    assert server._transport is not None
    port = server._transport.get_extra_info("sockname")[1]
    payload = b"\x5a" * object_size
    try:
        async with connect("127.0.0.1", port, configuration=client_config, wait_connected=True) as client:
            quic = client._quic
            loop = asyncio.get_running_loop()
            start = loop.time()
            deadline = start + seconds
            base = received[0]
            while loop.time() < deadline:
                sid = quic.get_next_available_stream_id(is_unidirectional=True)
                for i in range(GROUP_SIZE):
                    quic.send_stream_data(sid, payload, end_stream=i == GROUP_SIZE - 1)
                client.transmit()
                # Backpressure: aioquic buffers without bound, so keep at most two groups unacknowledged
                # (a finished uni stream leaves quic._streams once its FIN is acknowledged).
                while len(quic._streams) > 2 and loop.time() < deadline:
                    await asyncio.sleep(0.001)
            return loop.time() - start, received[0] - base
    finally:
        server.close()


def aioquic_baseline(object_size: int, seconds: float, datagram_size: int = 1200) -> Row:
    """`_aioquic_pair` in a child process (a fresh interpreter and loop, like a relay process)."""
    here = str(Path(__file__).parent)
    code = (f"import asyncio, sys; sys.path.insert(0, {here!r}); import bench_moqt_relay as b; "
            f"t, n = asyncio.run(b._aioquic_pair({seconds!r}, {object_size!r}, {datagram_size!r})); print(t, n)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=seconds + 60,
                         check=True, cwd=str(Path(__file__).resolve().parents[1])).stdout.split()
    active, nbytes = float(out[-2]), int(out[-1])
    mb = nbytes / active / 1e6
    return Row(f"aioquic-{datagram_size}", 1, object_size, seconds, round(nbytes / object_size / active, 1),
               round(mb, 2), [round(mb, 2)])


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per configuration")
    ap.add_argument("--subscribers", default="1,8", help="comma list of subscriber counts")
    ap.add_argument("--object-size", type=int, default=32768)
    ap.add_argument("--json", help="also write the rows as JSON here")
    ap.add_argument("--ours-only", action="store_true",
                    help="measure kvconform's relay only (not aiomoqt's or moq-rs's)")
    ap.add_argument("--aioquic-baseline", action="store_true",
                    help="also measure plain aioquic (no MOQT, no relay) sending the same objects")
    ap.add_argument("--baseline-datagram-size", type=int, default=1200,
                    help="max_datagram_size of the --aioquic-baseline endpoints (aioquic's default: 1200)")
    args = ap.parse_args()
    counts = [int(n) for n in args.subscribers.split(",")]
    # SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so the relays and containers are stopped.
    signal.signal(signal.SIGTERM, _interrupt)

    testbed = aiomoqt_testbed()
    dk.prepare_images(testbed)
    rows: list[Row] = []
    started = time.monotonic()
    if args.aioquic_baseline:
        rows.append(aioquic_baseline(args.object_size, args.seconds, args.baseline_datagram_size))
    with relays_under_test(testbed, ours_only=args.ours_only) as relays:
        for n in counts:
            # A B B A, best of two per relay: neither relay always runs right after the other's load.
            order = relays + relays[::-1]
            best: dict[str, Row] = {}
            for relay in order:
                row = measure(testbed, relay, n, args.object_size, args.seconds)
                if relay.name not in best or row.mb_per_s > best[relay.name].mb_per_s:
                    best[relay.name] = row
            rows += [best[r.name] for r in relays]
    print(f"MOQT relay on loopback: {args.object_size} B objects, {GROUP_SIZE} per group, 1 publisher, "
          f"{args.seconds:g} s each ({time.monotonic() - started:.0f} s in all)")
    print(f"{'relay':<13} {'subs':>4} {'objects/s':>10} {'MB/s':>8}  per subscriber MB/s")
    for row in rows:
        print(f"{row.relay:<13} {row.subscribers:>4} {row.objects_per_s:>10.1f} {row.mb_per_s:>8.2f}  "
              f"{row.per_subscriber_mb_per_s}")
    by = {(r.relay, r.subscribers): r for r in rows}
    for n in counts:
        for mine, theirs in (("kvconform", "aiomoqt"), ("kvconform", "moq-rs"), ("moq-rs", "aiomoqt")):
            a, b = by.get((mine, n)), by.get((theirs, n))
            if a and b and b.mb_per_s > 0:
                print(f"ratio {mine}/{theirs}, {n} subscriber(s): {a.mb_per_s / b.mb_per_s:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
