"""KBTP over the wire: drivers for targets and initiators in another process, any language, any NIC.

- ``kbtp+iwarp://HOST:PORT`` / ``kbtp+roce://HOST:PORT`` (kbtp-target): the harness is the initiator(s), over
  the userspace iWARP (MPA/DDP/RDMAP on TCP) or RoCEv2 (IB RC on UDP, QP exchange on a TCP side channel)
  binding of `kvconform.rdma.wire`. The target's PICS (binding, features, pool, quota...) come from the
  testbed and are cross-checked against its HELLO_ACK by the suites, as for every target.

A remote target keeps its state between checks: targets/kbtp_remote.py releases what each check opened.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import string
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kvconform import evidence
from kvconform.kbtp import control
from kvconform.kbtp.constants import Features
from kvconform.rdma import Fabric, Node, Profile, wait_until
from kvconform.rdma.profiles import Binding
from kvconform.rdma.roce.ethernet import LinkError, LinkSpec
from kvconform.rdma.wire.fabric import WireFabric
from kvconform.targets.kbtp import OpResult, TargetEndpoint, TargetParams
from kvconform.targets.kbtp_remote import Released, RemoteTarget
from kvconform.targets.kbtp_verbs import VerbsRemoteTargetDriver
from kvconform.targets.process import Process, fill_template
from kvconform.verdicts import TargetUnavailable

SCHEMES = {"kbtp+iwarp": "iwarp", "kbtp+roce": "roce"}
DEFAULT_PROFILE = {"iwarp": "rdmap-7306", "roce": "ib-rc"}


def wire_of(profile: Profile) -> str:
    """The wire binding that carries a profile: iWARP for RDMAP, RoCEv2 for InfiniBand RC."""
    return "iwarp" if profile.binding is Binding.RDMAP else "roce"


def check_binding(via: str, wire: str, params_binding: str, profile: Profile, pics: str) -> None:
    """TargetUnavailable unless ``wire`` carries ``profile`` (iWARP: RDMAP profiles; RoCEv2: InfiniBand ones)."""
    if wire_of(profile) != wire:
        raise TargetUnavailable(f"{pics} {params_binding} ({profile.binding.value}) is not carried by {via} (iWARP "
                                "carries the RDMAP profiles, RoCEv2 the InfiniBand ones)")


class WireTargetDriver:
    """kbtp-target driver of a target listening at ``host:port`` in the binding's wire format."""

    def __init__(self, scheme: str, host: str, port: int, link: LinkSpec | None = None,
                 rtr_delay_ms: int = 0) -> None:
        if scheme not in SCHEMES:
            raise TargetUnavailable(f"--target {scheme}://: not a KBTP wire scheme (known: {', '.join(SCHEMES)})")
        self.scheme = scheme
        self.wire = SCHEMES[scheme]
        self.host = host
        self.port = port
        self.link = link  # RoCEv2 as Ethernet frames over a qemu socket netdev (kvconform.rdma.roce.ethernet)
        self.rtr_delay_ms = rtr_delay_ms  # iWARP: the RTR this long after the MPA Reply (a siw race, interop-rdma #10)
        self.released: list[Released] = []  # sessions the harness released on it (RemoteTarget)

    @classmethod
    def from_url(cls, url: str) -> WireTargetDriver:
        """``kbtp+iwarp://HOST:PORT[?rtr_delay_ms=N]``, ``kbtp+roce://HOST:PORT[?ether=LOCAL,PEER&address=IP]``."""


        parts = urlsplit(url)
        if not parts.hostname or parts.port is None:
            raise TargetUnavailable(f"--target {url!r}: expected {parts.scheme}://HOST:PORT")
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        link, delay = None, 0
        if parts.scheme == "kbtp+iwarp" and query:
            if set(query) != {"rtr_delay_ms"} or not query["rtr_delay_ms"].isdigit():
                raise TargetUnavailable(f"--target {url!r}: the only query of kbtp+iwarp is ?rtr_delay_ms=N (the "
                                        "RTR N ms after the MPA Reply)")
            delay = int(query["rtr_delay_ms"])
        elif query:
            if parts.scheme != "kbtp+roce" or set(query) != {"ether", "address"}:
                raise TargetUnavailable(f"--target {url!r}: the only query of kbtp+roce is ?ether=LOCAL,PEER&"
                                        "address=IP (RoCEv2 frames over a qemu socket netdev)")
            try:
                link = LinkSpec.parse(query["ether"], query["address"])
            except LinkError as exc:
                raise TargetUnavailable(f"--target {url!r}: {exc}") from None
        return cls(parts.scheme, parts.hostname, parts.port, link, delay)

    def __repr__(self) -> str:
        query = f"?{self.link.query()}" if self.link else f"?rtr_delay_ms={self.rtr_delay_ms}" if self.rtr_delay_ms \
            else ""
        return f"{self.scheme}://{self.host}:{self.port}{query}"

    @property
    def default_binding(self) -> str:
        """The profile when PICS kbtp.target.binding is not declared: the scheme names the family."""
        return DEFAULT_PROFILE[self.wire]

    def make_fabric(self, params: TargetParams, *, trace: bool = False) -> Any:
        check_binding(f"{self.scheme}://", self.wire, params.binding, params.profile, "PICS kbtp.target.binding")
        options = {"rtr_delay_s": self.rtr_delay_ms / 1000} if self.rtr_delay_ms else None
        return WireFabric(params.profile, binding=self.wire, trace=trace, link=self.link,  # type: ignore[arg-type]
                          engine_options=options)

    def start(self, fabric: Fabric, node: Node, params: TargetParams) -> TargetEndpoint:
        return RemoteTarget(self, fabric)


def target_from_url(url: str) -> Any:
    """The kbtp-target driver of a URL: the userspace bindings' schemes, or ``kbtp+verbs://`` (a verbs device)."""
    if url.startswith("kbtp+verbs:"):

        return VerbsRemoteTargetDriver.from_url(url)
    return WireTargetDriver.from_url(url)


# ---- kbtp-initiator under the cmd: contract ---------------------------------------------------------------

OP_TIMEOUT_S = 30.0  # an operation the initiator never answers ends as a violation of what it was asked
CONNECT_WAIT_S = 15.0  # from start to its connection being set up


# The harness target's RoCEv2 link when the initiator under test is on a segment of its own (the testbed VM's
# rxe1): ``ether=LOCAL,PEER&address=IP``, the query of ``kbtp+roce://`` (kvconform.rdma.roce.ethernet)
HARNESS_LINK_OPTION = "--kbtp-harness-link"


def harness_link(text: str | None) -> LinkSpec | None:
    """The LinkSpec of a ``ether=LOCAL,PEER&address=IP`` text (None for none); TargetUnavailable naming the
    option."""
    if not text:
        return None
    query = {k: v[-1] for k, v in parse_qs(text, keep_blank_values=True).items()}
    try:
        if set(query) != {"ether", "address"}:
            raise LinkError("expected ether=LOCAL,PEER&address=IP")
        return LinkSpec.parse(query["ether"], query["address"])
    except LinkError as exc:
        raise TargetUnavailable(f"{HARNESS_LINK_OPTION} {text!r}: {exc}") from None


class CmdInitiatorDriver:
    """kbtp-initiator driver of a process under the cmd: contract (kvconform.kbtp.control, docs/kbtp-wire.md).

    Placeholders: ``{target}`` (always), ``{initiator_id}`` and ``{features}`` (optional). The harness target
    listens on 127.0.0.1; over RoCEv2 its packets go through the host's kernel, or over ``link`` (`kvconform run
    --kbtp-harness-link`: an initiator on a VM's rxe, the lane's bridge, testbeds/rdma_vm/bridge.py).
    """

    def __init__(self, template: str) -> None:
        self.template = template
        self.link: LinkSpec | None = None  # the harness target's RoCEv2 link (None: the host's UDP sockets)
        self._fill = fill_template
        self._process = Process

    def __repr__(self) -> str:
        return f"cmd:{self.template}"

    def make_fabric(self, params: TargetParams, *, trace: bool = False) -> Any:
        wire = wire_of(params.profile)
        if self.link is not None and wire != "roce":
            raise TargetUnavailable(f"{HARNESS_LINK_OPTION} is a RoCEv2 link: the initiator's binding "
                                    f"{params.binding} is not RoCEv2")
        return WireFabric(params.profile, binding=wire, trace=trace, link=self.link)  # type: ignore[arg-type]

    def start(self, fabric: Fabric, node: Node, conn: Any, params: Any) -> Any:
        raise TypeError("a cmd: initiator is launched (CmdInitiatorDriver.launch), not placed on a node")

    def launch(self, fabric: Any, target_url: str, params: Any) -> CmdInitiatorEndpoint:


        iid = secrets.token_bytes(16)
        feats = ",".join(f.name for f in Features if f & params.features and f.name)
        argv = self._fill(self.template, {"target": target_url, "initiator_id": iid.hex(), "features": feats})
        proc = self._process(argv, what="initiator under test", pipes=True)
        proc.start()
        # an Initiator ID the template hands the process is the harness's, not one the initiator generated
        handed = "initiator_id" in {f for _, f, _, _ in string.Formatter().parse(self.template) if f}
        return CmdInitiatorEndpoint(fabric, proc, iid, handed=handed)


class CmdInitiatorEndpoint:
    """InitiatorEndpoint of a cmd: process: each operation is a request line and a wait (bounded) for its answer."""

    def __init__(self, fabric: Any, proc: Any, initiator_id: bytes, *, handed: bool = False) -> None:

        self.fabric = fabric
        self.proc = proc
        self._iid = initiator_id
        # the Initiator ID the harness handed the process ({initiator_id} in its template); None: its own choice
        self.handed_initiator_id: bytes | None = initiator_id if handed else None
        self._ids = iter(range(1, 1 << 62))
        self.answers: dict[int, Any] = {}
        self.state: dict[str, Any] = {}
        self._inbox = bytearray()
        self.ended = ""
        self._fd = proc.stdout.fileno()
        os.set_blocking(self._fd, False)
        fabric.add_reader(self._fd, self._readable)

    def _readable(self) -> None:


        try:
            data = os.read(self._fd, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            self.ended = f"the initiator closed its stdout (exit status {self.proc.wait(0.5)})"
            self.fabric.remove_reader(self._fd)
            return
        self._inbox += data
        while b"\n" in self._inbox:
            line, _, rest = bytes(self._inbox).partition(b"\n")
            self._inbox[:] = rest
            try:
                a = control.parse_answer(line)
            except control.ControlError as exc:
                self.ended = f"the initiator broke the control channel: {exc}"
                continue
            self.answers[a.id] = a
            self.state.update({k: a.fields[k] for k in ("initiator_id", "handle_base", "handle_count", "quota")
                               if k in a.fields})

    def close(self) -> None:

        with contextlib.suppress(KeyError, ValueError, OSError):
            self.fabric.remove_reader(self._fd)
        result = self.proc.stop()

        evidence.record("received", "initiator process", result.evidence())

    def _call(self, op: str, **args: Any) -> Any:
        rid = next(self._ids)
        try:
            self.proc.stdin.write(control.request(rid, op, **args))
            self.proc.stdin.flush()
        except OSError as exc:
            raise RuntimeError(f"the initiator's stdin is closed ({exc}); {self.ended}") from exc
        got = yield from wait_until(lambda: rid in self.answers or bool(self.ended), name=f"answer.{op}",
                                    timeout=OP_TIMEOUT_S)
        a = self.answers.pop(rid, None)
        if a is None:
            raise RuntimeError(f"the initiator did not answer {op} {rid} within {OP_TIMEOUT_S:g} s"
                               if not got else f"no answer to {op} {rid}: {self.ended}")
        if a.error is not None:
            raise RuntimeError(f"the initiator failed {op}: {a.error}")
        return a.fields

    def _result(self, op: str, **args: Any) -> Any:
        f = yield from self._call(op, **args)
        data = f.get("data")
        return OpResult(int(f.get("status", 0)), int(f.get("generation", 0)), int(f.get("data_length", 0)),
                        int(f.get("block_offset", 0)), None if data is None else bytes.fromhex(data),
                        str(f.get("detail", "")))

    def hello(self) -> Any:
        f = yield from self._call("hello")
        granted = f.get("granted")
        if granted is None:
            return None
        out = Features(0)
        for name in granted:
            out |= Features[name]
        return out

    def alloc_store(self, handle: int, data: bytes, *, seal: bool = True) -> Any:
        return self._result("alloc_store", handle=handle, data=data, seal=seal)

    def store(self, handle: int, data: bytes, *, seal: bool = True, generation: int = 0) -> Any:
        return self._result("store", handle=handle, data=data, seal=seal, generation=generation)

    def load(self, handle: int, length: int, *, allow_unsealed: bool = False, generation: int = 0) -> Any:
        return self._result("load", handle=handle, length=length, allow_unsealed=allow_unsealed, generation=generation)

    def free(self, handle: int, *, generation: int = 0) -> Any:
        return self._result("free", handle=handle, generation=generation)

    def direct_load(self, handle: int, length: int) -> Any:
        return self._result("direct_load", handle=handle, length=length)

    def direct_alloc(self, handle: int, data: bytes) -> Any:
        return self._result("direct_alloc", handle=handle, data=data)

    def goodbye(self, release: bool = False) -> Any:
        yield from self._call("goodbye", release=release)
        return None

    @property
    def initiator_id(self) -> bytes:
        known = self.state.get("initiator_id")
        return bytes.fromhex(known) if known else self._iid

    @property
    def handle_base(self) -> int:
        return int(self.state.get("handle_base", 0))

    @property
    def handle_count(self) -> int:
        return int(self.state.get("handle_count", 0))

    @property
    def quota(self) -> int:
        return int(self.state.get("quota", 0))
