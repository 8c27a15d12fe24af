"""``kvconform serve kbtp-target``: the reference target (or a subclass: a mutant, a vendor's model) as a network
service over a wire binding, so a KBTP initiator in any process or language can be tried against it and the
harness can certify targets from the outside exactly as it would a NIC's.

    kvconform serve kbtp-target --binding iwarp|roce|verbs [--device rxe0] [--host 127.0.0.1] [--port 0]
        [--udp-port 4791] [--profile NAME] [--features DIRECT_LOAD,DIRECT_ALLOC,ADDR_LE] [--pool 4096,22,6,8]
        [--quota 2] [--handle-count 64] [--max-initiators 4] [--max-inline 256] [--ticket-timeout-ms 1000]
        [--untrusted HEX,...] [--target-class module:Class] [--driver-class module:Class] [--pcap DIR]

The defaults are the loopback testbed's PICS for ``kbtp.target`` (testbeds/loopback.yaml), so the served target
passes ``kvconform run kbtp-target --target kbtp+iwarp://HOST:PORT`` as declared there. Prints
``listening on HOST:PORT`` (and, for RoCEv2, ``udp HOST:PORT``) once connections are accepted.

``--binding verbs --device DEV`` serves it on a kernel RDMA device (rxe, siw, a NIC) through pyverbs: RoCE/IB
devices take the out-of-band QP exchange on ``--port`` (the bytes of ``kbtp+roce://``), iWARP devices rdma_cm
on ``--host`` (an address of the device's netdev; rdma_cm refuses 127.0.0.1). The profile defaults to ib-rc
(RoCE) or rdmap-5040 (iWARP without RFC 7306, as siw is).

``kvconform serve kbtp-initiator --target URL [--binding wire|verbs --device DEV]`` is the reference initiator
under the ``cmd:`` contract: over the userspace binding the URL's scheme names (``wire``, the default), or on a
kernel RDMA device (``verbs``: rxe dials the target's out-of-band exchange, siw its rdma_cm listener), so that a
harness target on a wire facing the device sees every one-sided operation the device executes.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from typing import Any
from urllib.parse import urlsplit

from kvconform.argtypes import OneLineParser, port_or_zero, positive_int
from kvconform.components import SUMMARIES, until_stopped
from kvconform.kbtp import control
from kvconform.kbtp.constants import Features
from kvconform.kbtp.initiator import ReferenceInitiator
from kvconform.kbtp.target import ReferenceTarget
from kvconform.loading import load_subclass
from kvconform.rdma.profiles import PROFILES
from kvconform.rdma.roce.ethernet import LinkSpec
from kvconform.rdma.verbs.device import VerbsUnavailable, query
from kvconform.rdma.verbs.fabric import VerbsFabric
from kvconform.rdma.wire.fabric import WireFabric
from kvconform.rdma.wire.impair import Impairment
from kvconform.targets.kbtp import (
    InitiatorParams,
    OpResult,
    ReferenceInitiatorDriver,
    ReferenceTargetDriver,
    TargetParams,
)
from kvconform.targets.kbtp_wire import DEFAULT_PROFILE, SCHEMES, check_binding
from kvconform.verdicts import TargetUnavailable

DEFAULT_FEATURES = "DIRECT_LOAD,DIRECT_ALLOC,ADDR_LE"


def _features(text: str) -> Features:
    out = Features(0)
    for name in filter(None, (p.strip() for p in text.split(","))):
        try:
            out |= Features[name]
        except KeyError:
            raise argparse.ArgumentTypeError(f"--features: unknown feature {name!r} "
                                             f"(known: {', '.join(f.name for f in Features if f.name)})") from None
    return out


def _pool(text: str) -> tuple[int, ...]:
    try:
        parts = tuple(int(p) for p in text.split(","))
    except ValueError:
        parts = ()
    if not 2 <= len(parts) <= 4:
        raise argparse.ArgumentTypeError(f"--pool {text!r}: expected BLOCK_SIZE,BLOCKS[,SHARED_BLOCKS[,RING_SLOTS]]")
    return parts


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="kvconform serve kbtp-target", description=SUMMARIES["kbtp-target"])
    p.add_argument("--binding", choices=("iwarp", "roce", "verbs"), required=True,
                   help="wire format: iwarp (MPA/DDP/RDMAP over TCP) or roce (IB RC over RoCEv2/UDP), userspace; "
                        "verbs: a kernel RDMA device (--device)")
    p.add_argument("--device", default=None, help="--binding verbs: the verbs device (ibv_devices), e.g. rxe0, siw0")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1 only)")
    p.add_argument("--port", type=port_or_zero, default=0,
                   help="TCP port: the iWARP stream, or RoCEv2's out-of-band QP exchange; 0 picks a free one")
    p.add_argument("--udp-port", type=port_or_zero, default=4791, help="RoCEv2 UDP port (default 4791; 0: any)")
    p.add_argument("--ether", default=None, metavar="LOCAL,PEER",
                   help="--binding roce: RoCEv2 as Ethernet frames over a qemu socket netdev (loopback HOST:PORT of "
                        "this end and of qemu) instead of UDP through this host's kernel; needs --ether-address")
    p.add_argument("--ether-address", default=None, metavar="IP",
                   help="--ether: this end's IPv4 address on that segment (its GID)")
    p.add_argument("--profile", default=None,
                   help="capability profile (default rdmap-7306 for iwarp, ib-rc for roce; see kvconform.rdma)")
    p.add_argument("--features", type=_features, default=_features(DEFAULT_FEATURES),
                   help=f"optional features to offer (default {DEFAULT_FEATURES}; '' for none)")
    p.add_argument("--pool", type=_pool, default=(4096, 22, 6, 8),
                   help="BLOCK_SIZE,BLOCKS[,SHARED_BLOCKS[,RING_SLOTS]] (default 4096,22,6,8)")
    p.add_argument("--quota", type=int, default=2, help="Allocation Quota per initiator")
    p.add_argument("--handle-count", type=positive_int, default=64)
    p.add_argument("--max-initiators", type=positive_int, default=4)
    p.add_argument("--max-inline", type=int, default=256)
    p.add_argument("--ticket-timeout-ms", type=positive_int, default=1000)
    p.add_argument("--untrusted", default="", help="Initiator IDs (hex, comma-separated) not trusted with direct modes")
    p.add_argument("--target-class", default=None,
                   help="module:Class of the target (a kvconform.kbtp.target.ReferenceTarget subclass; default: "
                        "the driver's, else the reference)")
    p.add_argument("--driver-class", default="kvconform.targets.kbtp:ReferenceTargetDriver",
                   help="module:Class of the driver that starts the target (a kvconform.targets.kbtp."
                        "ReferenceTargetDriver subclass: its target_class, its starting Generation, and its "
                        "wire_fabric_class, a model of its RNIC, if it has one); --target-class overrides its class")
    p.add_argument("--pcap", default=None, metavar="DIR", help="write each connection's wire as a pcap there")
    p.add_argument("--impair", default=None, metavar="SPEC",
                   help="impair this target's wire links both ways, seeded: loss=P,reorder=P,dup=P,delay=5ms,seed=S "
                        "(kvconform.rdma.wire.impair; not with --binding verbs)")
    return p


def params_of(args: argparse.Namespace, default_profile: str | None = None) -> TargetParams:
    pool = list(args.pool) + [None] * (4 - len(args.pool))
    return TargetParams(
        binding=args.profile or default_profile or DEFAULT_PROFILE[args.binding], features=args.features,
        block_size=pool[0], blocks=pool[1], shared_blocks=pool[2], ring_slots=pool[3], quota=args.quota,
        handle_count=args.handle_count,
        max_initiators=args.max_initiators, max_inline=args.max_inline, ticket_timeout_ms=args.ticket_timeout_ms,
        untrusted_initiators=tuple(bytes.fromhex(i) for i in filter(None, args.untrusted.split(","))))


def ether_link(args: argparse.Namespace) -> LinkSpec | None:
    """The `LinkSpec` of ``--ether``/``--ether-address`` (None without them); ValueError naming the option."""
    if args.ether is None and args.ether_address is None:
        return None
    if args.binding != "roce" or args.ether is None or args.ether_address is None:
        raise ValueError("--ether LOCAL,PEER and --ether-address IP go together, with --binding roce")
    return LinkSpec.parse(args.ether, args.ether_address)


def serve_kbtp_target(argv: list[str], stop: threading.Event | None = None) -> int:
    """Run until SIGINT/SIGTERM (or ``stop`` is set, for in-process callers)."""
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    prog = "kvconform serve kbtp-target"
    try:
        verbs = None
        if args.binding == "verbs":
            if not args.device:
                raise ValueError("--binding verbs needs --device (ibv_devices lists them)")
            try:
                verbs = query(args.device)
            except VerbsUnavailable as exc:
                raise TargetUnavailable(str(exc)) from exc
        params = params_of(args, None if verbs is None else ("rdmap-5040" if verbs.transport == "iwarp" else "ib-rc"))
        if params.binding not in PROFILES:
            raise ValueError(f"--profile {params.binding!r}: known profiles {', '.join(PROFILES)}")
        driver = load_subclass(args.driver_class, ReferenceTargetDriver, "--driver-class")()
        if args.target_class is not None or driver.target_class is None:
            driver.target_class = load_subclass(args.target_class or "kvconform.kbtp.target:ReferenceTarget",
                                                ReferenceTarget, "--target-class")
        fabric: Any
        if verbs is not None and args.impair:
            raise ValueError("--impair acts on the userspace bindings' links; a verbs device builds its own packets "
                             "(tc netem on its interface impairs those)")
        if verbs is not None:
            try:
                fabric = VerbsFabric(params.profile, device=args.device, host=args.host, capture_dir=args.pcap,
                                     info=verbs)
            except VerbsUnavailable as exc:
                raise TargetUnavailable(str(exc)) from exc
        else:
            check_binding(f"--binding {args.binding}", args.binding, params.binding, params.profile, "--profile")
            # a driver may bring its own RNIC model (a WireFabric subclass): a vendor's, or a mutant's broken engine
            fabric_class: type[WireFabric] = getattr(driver, "wire_fabric_class", WireFabric)
            fabric = fabric_class(params.profile, binding=args.binding, host=args.host, udp_port=args.udp_port,
                                capture_dir=args.pcap, link=ether_link(args),
                                impair=Impairment.parse(args.impair) if args.impair else None)
        node = fabric.node("target")
        endpoint = driver.start(fabric, node, params)
        listener = fabric.listen(node, args.host, args.port, endpoint.attach)
    except (ValueError, TargetUnavailable, OSError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    print(f"listening on {args.host}:{fabric.port_of(listener)}", flush=True)
    if fabric.binding == "roce":
        print(f"udp {fabric.roce_address}:{fabric.udp_port}", flush=True)
    with until_stopped(stop) as event:
        try:
            fabric.serve_forever(stop=event.is_set)
        finally:
            fabric.close()
    return 0


VERBS_PROFILE = {"iwarp": "rdmap-5040", "roce": "ib-rc"}  # as serve kbtp-target --binding verbs defaults


def _initiator_device(args: argparse.Namespace, wire: str) -> Any:
    """The verbs device of ``--binding verbs`` (None for the userspace wire); ValueError naming what is wrong,
    TargetUnavailable when the device cannot be used."""
    if args.binding != "verbs":
        if args.device or args.local:
            raise ValueError("--device and --local go with --binding verbs")
        return None
    if not args.device:
        raise ValueError("--binding verbs needs --device (ibv_devices lists them)")
    try:
        info = query(args.device)
    except VerbsUnavailable as exc:
        raise TargetUnavailable(str(exc)) from exc
    if (info.transport == "iwarp") != (wire == "iwarp"):
        raise ValueError(f"--target {args.target!r}: {info.describe()} does not carry {wire} (iWARP devices dial "
                         "kbtp+iwarp://, RoCE devices kbtp+roce://)")
    return info


def initiator_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="kvconform serve kbtp-initiator", description=SUMMARIES["kbtp-initiator"])
    p.add_argument("--target", required=True, help="the target: kbtp+iwarp://HOST:PORT or kbtp+roce://HOST:PORT")
    p.add_argument("--binding", choices=("wire", "verbs"), default="wire",
                   help="wire: the userspace binding of the target's scheme (default); verbs: a kernel RDMA device "
                        "(--device) whose transport the scheme names (RoCE: kbtp+roce, iWARP: kbtp+iwarp)")
    p.add_argument("--device", default=None, help="--binding verbs: the verbs device (ibv_devices), e.g. rxe1, siw1")
    p.add_argument("--local", default=None, metavar="IP",
                   help="--binding verbs: an address of the device's netdev (RoCE: its GID; iWARP: rdma_cm's source)")
    p.add_argument("--profile", default=None,
                   help="capability profile (default rdmap-7306 / ib-rc by scheme; on a device as for serve "
                        "kbtp-target --binding verbs: rdmap-5040 on iWARP, ib-rc on RoCE)")
    p.add_argument("--features", type=_features, default=_features(DEFAULT_FEATURES),
                   help=f"optional features to request (default {DEFAULT_FEATURES})")
    p.add_argument("--initiator-id", default=None, help="Initiator ID, 32 hex digits (default: random)")
    p.add_argument("--no-invalidate", action="store_true", help="do not ask for Send with Invalidate")
    p.add_argument("--initiator-class", default=None,
                   help="module:Class of the initiator (a kvconform.kbtp.initiator.ReferenceInitiator subclass; "
                        "default: the driver's, else the reference)")
    p.add_argument("--driver-class", default="kvconform.targets.kbtp:ReferenceInitiatorDriver",
                   help="module:Class of the driver that starts the initiator and stands between it and the "
                        "harness (a kvconform.targets.kbtp.ReferenceInitiatorDriver subclass); --initiator-class "
                        "overrides its class")
    return p


def serve_kbtp_initiator(argv: list[str], stop: threading.Event | None = None) -> int:
    """The reference initiator as a process under the ``cmd:`` contract (kvconform.kbtp.control): it connects
    to ``--target``, then performs the operations it reads on stdin and answers each on stdout."""
    try:
        args = initiator_parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    prog = "kvconform serve kbtp-initiator"
    url = urlsplit(args.target)
    try:
        if url.scheme not in SCHEMES or not url.hostname or url.port is None:
            raise ValueError(f"--target {args.target!r}: expected kbtp+iwarp://HOST:PORT or kbtp+roce://HOST:PORT")
        binding = SCHEMES[url.scheme]
        verbs = _initiator_device(args, binding)
        default = DEFAULT_PROFILE[binding] if verbs is None else VERBS_PROFILE[binding]
        profile_name = args.profile or default
        if profile_name not in PROFILES:
            raise ValueError(f"--profile {profile_name!r}: known profiles {', '.join(PROFILES)}")
        params = InitiatorParams(binding=profile_name, features=args.features,
                                 requests_invalidate=not args.no_invalidate)
        check_binding(f"{url.scheme}://", binding, profile_name, params.profile, "--profile")
        driver = load_subclass(args.driver_class, ReferenceInitiatorDriver, "--driver-class")()
        if args.initiator_class is not None or driver.initiator_class is None:
            spec = args.initiator_class or "kvconform.kbtp.initiator:ReferenceInitiator"
            driver.initiator_class = load_subclass(spec, ReferenceInitiator, "--initiator-class")
        fabric: Any
        if verbs is not None:
            try:
                fabric = VerbsFabric(params.profile, device=args.device, host=args.local, info=verbs,
                                     gid_address=args.local)
            except VerbsUnavailable as exc:
                raise TargetUnavailable(str(exc)) from exc
        else:
            fabric = WireFabric(params.profile, binding=binding)  # type: ignore[arg-type]
        node = fabric.node("I")
        conn = fabric.dial(fabric.remote("target", url.hostname, url.port), node, name="I-conn")
        endpoint: Any = driver.start(fabric, node, conn, params)
        if args.initiator_id:
            endpoint.ini.initiator_id = bytes.fromhex(args.initiator_id)
    except (ValueError, TargetUnavailable, OSError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2

    out = sys.stdout.buffer
    running = [0]
    eof = [False]
    inbox = bytearray()

    def state() -> dict[str, Any]:
        return {"initiator_id": endpoint.initiator_id.hex(), "handle_base": endpoint.handle_base,
                "handle_count": endpoint.handle_count, "quota": endpoint.quota}

    def perform(body: dict[str, Any]) -> Any:
        rid, op = body["id"], body["op"]
        try:
            if op == "hello":
                granted = yield from endpoint.hello()
                fields: dict[str, Any] = {"granted": None if granted is None else
                                          [f.name for f in Features if f & granted and f.name]}
            else:
                args_ = {k: body[k] for k in control.FIELDS[op]}
                result = yield from getattr(endpoint, op)(**args_)
                fields = {} if not isinstance(result, OpResult) else {
                    "status": int(result.status), "generation": result.generation,
                    "data_length": result.data_length, "block_offset": result.block_offset,
                    "data": result.data, "detail": result.detail}
            out.write(control.answer(rid, **fields, **state()))
        except Exception as exc:  # the initiator's own failure, reported to the harness as the contract says
            out.write(control.answer(rid, error=f"{type(exc).__name__}: {exc}", **state()))
        out.flush()
        running[0] -= 1

    def on_stdin() -> None:
        data = os.read(sys.stdin.fileno(), 1 << 16)
        if not data:
            eof[0] = True
            fabric.remove_reader(sys.stdin.fileno())
            return
        inbox.extend(data)
        while b"\n" in inbox:
            line, _, rest = bytes(inbox).partition(b"\n")
            inbox[:] = rest
            try:
                body = control.parse_request(line)
            except control.ControlError as exc:
                print(f"{prog}: {exc}", file=sys.stderr)
                continue
            running[0] += 1
            fabric.spawn(f"op{body['id']}", perform(body), daemon=True)

    fabric.add_reader(sys.stdin.fileno(), on_stdin)
    with until_stopped(stop) as event:
        try:
            fabric.serve_forever(stop=lambda: event.is_set() or (eof[0] and running[0] == 0))
        finally:
            fabric.close()
    return 0
