"""Wire mutants: targets whose RNIC (the wire binding's engine) or whose pool breaks one wire-binding rule. Each is
a reference target driver that always runs in-process over loopback sockets in its binding's wire format, with
the broken engine on the target's side only (the harness's own endpoints keep the correct one)."""

from __future__ import annotations

from typing import Any

from kvconform.kbtp.target import ReferenceTarget
from kvconform.rdma.engine import Source
from kvconform.rdma.fabric import Access, Terminate
from kvconform.rdma.iwarp import ddp
from kvconform.rdma.iwarp.engine import IwarpEngine
from kvconform.rdma.roce.engine import RoceEngine
from kvconform.rdma.roce.icrc import append_icrc
from kvconform.rdma.wire.fabric import WireConnection, WireFabric
from kvconform.targets.kbtp import ReferenceTargetDriver, TargetParams


class _NoCrcCheck:
    """An MPA reassembler that never checks the CRC field, whatever was negotiated."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    @property
    def crc(self) -> bool:
        return False

    @crc.setter
    def crc(self, value: bool) -> None:
        pass

    def feed(self, data: bytes) -> None:
        self.inner.crc = False
        self.inner.feed(data)

    def next(self) -> bytes | None:
        self.inner.crc = False
        result: bytes | None = self.inner.next()
        return result


class _CrcIgnored(IwarpEngine):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reasm = _NoCrcCheck(self.reasm)  # type: ignore[assignment]


class _SilentOnBadStag(IwarpEngine):
    def _write(self, seg: ddp.Segment) -> None:
        if isinstance(self.memory.resolve(seg.stag, seg.to, len(seg.payload), Access.REMOTE_WRITE, tagged=True),
                      Terminate):
            return  # dropped without a Terminate
        super()._write(seg)


class _TakesAnyReadResponse(IwarpEngine):
    def _read_response(self, seg: ddp.Segment) -> None:
        if not self.pending:
            return  # an unsolicited Read Response ignored instead of terminated
        super()._read_response(seg)


class _IcrcIgnored(RoceEngine):
    def receive(self, data: bytes, now: float, source: Source | None = None) -> None:
        # re-seal every packet with a right ICRC: a wrong one is never seen
        src = source or Source(self.remote.ip, self.remote.port)
        fixed = append_icrc(src.address, src.port, self.local.ip, self.local.port, data[:-4], src.ip_ident)
        super().receive(fixed, now, src)


class _MutantFabric(WireFabric):
    iwarp_class: type[IwarpEngine] = IwarpEngine
    roce_class: type[RoceEngine] = RoceEngine

    def make_iwarp_engine(self, conn: WireConnection, initiator: bool) -> Any:
        if conn.node.name != "target":
            return super().make_iwarp_engine(conn, initiator)
        return self.iwarp_class(conn.name, self._memory(conn), initiator=initiator, peer=conn.peer_name)

    def make_roce_engine(self, conn: WireConnection, local: Any, remote: Any) -> Any:
        if conn.node.name != "target":
            return super().make_roce_engine(conn, local, remote)
        return self.roce_class(conn.name, self._memory(conn), local=local, remote=remote, pmtu=self.profile.pmtu,
                               masked_atomics=self.profile.masked_atomics)


class _WireDriver(ReferenceTargetDriver):
    iwarp_class: type[IwarpEngine] = IwarpEngine
    roce_class: type[RoceEngine] = RoceEngine

    def make_fabric(self, params: TargetParams, *, trace: bool = False) -> Any:
        from kvconform.targets.kbtp_wire import wire_of

        fabric = _MutantFabric(params.profile, binding=wire_of(params.profile), trace=trace)  # type: ignore[arg-type]
        fabric.iwarp_class, fabric.roce_class = self.iwarp_class, self.roce_class
        return fabric

    @property
    def wire_fabric_class(self) -> type[WireFabric]:
        """The broken RNIC served in its own process (`kvconform serve kbtp-target --driver-class`)."""
        return type(f"{type(self).__name__}Fabric", (_MutantFabric,),
                    {"iwarp_class": self.iwarp_class, "roce_class": self.roce_class})


class WireIgnoresCrc(_WireDriver):
    """KBTP-WIRE-MPA-CRC: the target's RNIC delivers FPDUs whose CRC-32C does not match."""

    iwarp_class = _CrcIgnored


class WireSilentOnBadStag(_WireDriver):
    """KBTP-WIRE-DDP-TAGGED: a tagged segment with an STag the target never advertised is dropped silently, the
    stream goes on without the Terminate DDP requires."""

    iwarp_class = _SilentOnBadStag


class WireTakesUnaskedReadResponse(_WireDriver):
    """KBTP-WIRE-RDMAP-UNEXPECTED: an RDMA Read Response the target never requested is ignored, not terminated."""

    iwarp_class = _TakesAnyReadResponse


class WireIgnoresIcrc(_WireDriver):
    """KBTP-WIRE-IB-DROP: the target's RNIC accepts RoCEv2 packets whose ICRC is wrong."""

    roce_class = _IcrcIgnored


class _ForgetsEveryoneOnError(ReferenceTarget):
    def end_session(self, s: Any, release: bool) -> Any:
        yield from super().end_session(s, release)
        if not release:  # a connection that failed takes every other session's bindings with it
            for record in list(self.records.values()):
                yield from self.forget(record)


class WireErrorSpreads(_WireDriver):
    """KBTP-WIRE-INTACT: one connection's wire error releases every session's bindings, the victim's included."""

    target_class = _ForgetsEveryoneOnError
