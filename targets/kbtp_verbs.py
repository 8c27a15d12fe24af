"""KBTP on a kernel RDMA device: the testbed's ``driver: verbs`` entries (issue 13 §2).

A ``verbs`` target entry names a device (``verbs: {device: rxe0, address: ...}``). For the kbtp-target suite
the reference target is served on that device in this process and the harness's initiators connect to it on
the same device, each node its own protection domain, so every Send, Write, Read, atomic, window bind and
invalidation is the device's (rxe's RoCEv2, siw's iWARP, a NIC's firmware). For kbtp-initiator the reference
initiator runs on the device against the harness's target. A target in another process on a verbs device is
reached with ``kbtp+roce://`` / ``kbtp+iwarp://`` (the out-of-band exchange and rdma_cm are the same bytes) or
``kbtp+verbs://HOST:PORT?device=DEV`` when the harness itself must be on the device.

Without pyverbs, without the device, or with PICS the device cannot carry (atomics on siw), every check is
inconclusive with the one-line reason (`kvconform.rdma.verbs.device.skip_reason`): nothing was exchanged,
so nothing is judged.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from kvconform.rdma import Connection, Fabric, Node
from kvconform.rdma.verbs.device import VerbsUnavailable, skip_reason
from kvconform.rdma.verbs.fabric import VerbsFabric
from kvconform.targets.kbtp import (
    InitiatorEndpoint,
    InitiatorParams,
    ReferenceInitiatorDriver,
    ReferenceTargetDriver,
    TargetEndpoint,
    TargetParams,
)
from kvconform.targets.kbtp_remote import Released, RemoteTarget
from kvconform.verdicts import TargetUnavailable


class VerbsDevice:
    """Where a verbs entry's fabric lives: device, port and (iWARP) the address of its netdev."""

    def __init__(self, device: str, port: int = 1, address: str | None = None, transport: str | None = None,
                 where: str = "local") -> None:
        self.device = device
        self.device_port = port  # the device's port (1 on most NICs), not a TCP port
        self.address = address
        self.transport = transport  # declared; cross-checked against the device
        self.where = where  # "rdma-vm": the device exists inside the testbed VM

    @classmethod
    def from_spec(cls, target: Any) -> VerbsDevice:
        raw = dict(target.params.get("verbs") or {})
        if not raw.get("device"):
            raise TargetUnavailable(f"target {target.name}: a verbs entry needs verbs.device")
        return cls(str(raw["device"]), int(raw.get("port", 1)), raw.get("address"), raw.get("transport"),
                   str(raw.get("host", "local")))

    def __repr__(self) -> str:
        return f"verbs:{self.device}" + (f"@{self.address}" if self.address else "")

    def make_fabric(self, params: Any, *, trace: bool = False) -> Any:
        why = skip_reason(self.device, params.profile)
        if why is not None:
            if self.where == "rdma-vm":
                why += " (the device exists inside the testbed VM: run there, as .ci/rdma does)"
            raise TargetUnavailable(why)
        try:
            fabric = VerbsFabric(params.profile, device=self.device, port=self.device_port, host=self.address,
                                 trace=trace, gid_address=self.address)
        except VerbsUnavailable as exc:
            raise TargetUnavailable(f"verbs: {exc}") from exc
        if self.transport is not None and self.transport != fabric.info.transport:
            fabric.close()
            raise TargetUnavailable(f"verbs.transport {self.transport} declared, but {fabric.info.describe()}")
        return fabric


class VerbsTargetDriver(VerbsDevice):
    """kbtp-target: the reference target served on the device, the harness's initiators on it too."""

    def start(self, fabric: Fabric, node: Node, params: TargetParams) -> TargetEndpoint:
        return ReferenceTargetDriver().start(fabric, node, params)


class VerbsInitiatorDriver(VerbsDevice):
    """kbtp-initiator: the reference initiator on the device, against the harness's target on it."""

    def start(self, fabric: Fabric, node: Node, conn: Connection, params: InitiatorParams) -> InitiatorEndpoint:
        return ReferenceInitiatorDriver().start(fabric, node, conn, params)


class VerbsRemoteTargetDriver(VerbsDevice):
    """``kbtp+verbs://HOST:PORT?device=DEV[&local=ADDR]``: a target in another process (any implementation, a
    NIC's offload) served at HOST:PORT, the harness's initiators on verbs device DEV. ``local`` is an address of
    DEV's netdev: the rdma_cm source (iWARP; default: the kernel's route to HOST) or the address whose RoCEv2 GID
    the harness's QPs use (default: the port's first)."""

    def __init__(self, device: str, host: str, port: int, local: str | None = None) -> None:
        super().__init__(device, address=local)
        self.host = host
        self.port = port  # the target's TCP port (its out-of-band exchange or rdma_cm listener)
        self.released: list[Released] = []  # sessions the harness released on it (RemoteTarget)

    @classmethod
    def from_url(cls, url: str) -> VerbsRemoteTargetDriver:

        parts = urlsplit(url)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        usage = "expected kbtp+verbs://HOST:PORT?device=DEV[&local=ADDR]"
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or port is None or not query.get("device") or set(query) - {"device", "local"}:
            raise TargetUnavailable(f"--target {url!r}: {usage}")
        return cls(query["device"], parts.hostname, port, query.get("local"))

    def __repr__(self) -> str:
        local = f"&local={self.address}" if self.address else ""
        return f"kbtp+verbs://{self.host}:{self.port}?device={self.device}{local}"

    def start(self, fabric: Fabric, node: Node, params: TargetParams) -> TargetEndpoint:
        return RemoteTarget(self, fabric)
