"""Verbs device discovery and capabilities (rdma-bindings §6.1, §6.5), without ever raising.

`discover` lists what the host has: devices, their transport (InfiniBand/RoCE or iWARP), port state, the GID
index of a RoCEv2 IPv4 address, the atomic capability and memory windows. `skip_reason` is the one line a
suite or a test prints when it cannot run (no pyverbs, no such device, port down, a capability the PICS need
is missing): never a crash, never a verdict. `profile_for` is what the device can carry of a declared
profile: a device without atomics cannot run a profile that has them (the PICS are wrong, which is said), and
a device without type-2 memory windows runs with windows emulated by one-off memory regions (see the fabric).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from kvconform.rdma.profiles import Binding, Profile

IBV_TRANSPORT_IWARP = 1
IBV_PORT_ACTIVE = 4
IBV_ATOMIC_NONE = 0
IBV_ATOMIC_HCA = 1
IBV_GID_TYPE_ROCE_V2 = 1  # ibv_query_gid_type: IBV_GID_TYPE_ROCE_V2 (sysfs "RoCE v2")
MTU_BYTES = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}


try:  # the error class of every failed pyverbs call, where pyverbs exists
    from pyverbs.pyverbs_error import PyverbsError as PyverbsError
except ImportError:  # pragma: no cover - no rdma-core here
    class PyverbsError(Exception):  # type: ignore[no-redef]
        """Stands for pyverbs' error class where pyverbs is not installed (nothing raises it then)."""


class VerbsUnavailable(RuntimeError):
    """The verbs path cannot run here (no pyverbs, no device, no capability): a skip, not a verdict."""


def pyverbs() -> Any:
    """The pyverbs package, or VerbsUnavailable saying how to get it (it comes with rdma-core, not PyPI)."""
    try:
        import pyverbs.device  # optional: pyverbs ships with rdma-core, on RDMA hosts only
        import pyverbs.enums
    except ImportError as exc:
        raise VerbsUnavailable(f"pyverbs is not importable ({exc}); it ships with rdma-core "
                               "(Debian: python3-pyverbs)") from exc
    return pyverbs


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """What the harness needs to know of one verbs device (port 1 unless said)."""

    name: str
    transport: str  # "roce" (IB transport over Ethernet), "ib" or "iwarp"
    port: int
    port_active: bool
    active_mtu: int  # octets
    atomic_caps: int  # IBV_ATOMIC_NONE / HCA / GLOB
    max_mw: int
    max_qp_rd_atom: int
    max_sge: int
    gid_index: int | None  # the RoCEv2 GID of an IPv4 address (None: none, or not RoCE)
    gid_address: str | None  # that IPv4 address

    @property
    def atomics(self) -> bool:
        return self.atomic_caps != IBV_ATOMIC_NONE

    @property
    def windows(self) -> bool:
        return self.max_mw > 0

    @property
    def reports_invalidation(self) -> bool:
        """Whether a receive completion says a Send with Invalidate invalidated an STag (siw's do not)."""
        return not self.name.startswith("siw")

    def describe(self) -> str:
        parts = [f"{self.name}: {self.transport}", "port ACTIVE" if self.port_active else "port DOWN",
                 f"MTU {self.active_mtu}", f"atomics {'yes' if self.atomics else 'no'}",
                 f"memory windows {'yes' if self.windows else 'no'}"]
        if self.gid_address:
            parts.append(f"RoCEv2 GID {self.gid_index} = {self.gid_address}")
        return ", ".join(parts)


def query(name: str, port: int = 1, address: str | None = None) -> DeviceInfo:
    """One device's DeviceInfo; VerbsUnavailable when pyverbs or the device is missing. On RoCE, the GID is the
    first RoCEv2 one of an IPv4 address, or of ``address`` when given (a host with several)."""
    pv = pyverbs()
    from pyverbs.device import Context, get_device_list  # optional: pyverbs ships with rdma-core, on RDMA hosts only
    from pyverbs.pyverbs_error import PyverbsError

    try:
        devices = {d.name.decode(): d for d in get_device_list()}
    except PyverbsError as exc:
        raise VerbsUnavailable(f"no RDMA stack: {exc}") from exc
    if name not in devices:
        raise VerbsUnavailable(f"no verbs device {name!r} here (devices: {', '.join(sorted(devices)) or 'none'})")
    iwarp = int(devices[name].transport_type) == IBV_TRANSPORT_IWARP
    ctx = Context(name=name)
    try:
        attr = ctx.query_device()
        pattr = ctx.query_port(port)
        link_eth = int(pattr.link_layer) == int(pv.enums.IBV_LINK_LAYER_ETHERNET)
        gid_index = gid_address = None
        if not iwarp and link_eth:
            for i in range(int(pattr.gid_tbl_len)):
                try:
                    gid = ctx.query_gid(port, i).gid
                    kind = ctx.query_gid_type(port, i)
                except PyverbsError:
                    continue
                mapped = ipaddress.IPv6Address(gid).ipv4_mapped
                if mapped is not None and int(kind) == IBV_GID_TYPE_ROCE_V2 and address in (None, str(mapped)):
                    gid_index, gid_address = i, str(mapped)
                    break
            if address is not None and gid_address is None:
                raise VerbsUnavailable(f"device {name} port {port} has no RoCEv2 GID of {address} (show_gids)")
        return DeviceInfo(name=name, transport="iwarp" if iwarp else ("roce" if link_eth else "ib"), port=port,
                          port_active=int(pattr.state) == IBV_PORT_ACTIVE,
                          active_mtu=MTU_BYTES.get(int(pattr.active_mtu), 256), atomic_caps=int(attr.atomic_caps),
                          max_mw=int(attr.max_mw), max_qp_rd_atom=int(attr.max_qp_rd_atom),
                          max_sge=int(attr.max_sge), gid_index=gid_index, gid_address=gid_address)
    finally:
        ctx.close()


def discover() -> list[DeviceInfo]:
    """Every verbs device of this host; [] when there is no RDMA stack or no pyverbs (never raises)."""
    try:
        pyverbs()
        from pyverbs.device import get_device_list  # optional: pyverbs ships with rdma-core, on RDMA hosts only

        names = [d.name.decode() for d in get_device_list()]
    except Exception:
        return []
    out = []
    for n in names:
        try:
            out.append(query(n))
        except Exception:
            continue
    return out


def skip_reason(name: str, profile: Profile | None = None) -> str | None:
    """Why the verbs path cannot run on device ``name`` (for ``profile``), in one line; None when it can."""
    try:
        info = query(name)
    except VerbsUnavailable as exc:
        return f"verbs: {exc}"
    except Exception as exc:
        return f"verbs: device {name} cannot be opened: {exc!r}"
    if not info.port_active:
        return f"verbs: {info.describe()}: port {info.port} is not ACTIVE"
    if profile is not None:
        try:
            profile_for(info, profile)
        except VerbsUnavailable as exc:
            return f"verbs: {exc}"
    return None


def profile_for(info: DeviceInfo, declared: Profile) -> Profile:
    """The profile the fabric runs: the declared one as far as the device carries it; VerbsUnavailable naming
    the mismatch when the declaration asks for what the device cannot do."""
    family = Binding.RDMAP if info.transport == "iwarp" else Binding.IB
    if declared.binding is not family:
        raise VerbsUnavailable(f"device {info.name} is {info.transport}, but binding {declared.name} is "
                               f"{declared.binding.value} (iWARP devices carry the RDMAP profiles, IB/RoCE the IB "
                               "ones)")
    if declared.atomics and not info.atomics:
        raise VerbsUnavailable(f"binding {declared.name} has atomics, device {info.name} has none (atomic_caps 0): "
                               "declare a profile without atomics (rdmap-5040 for iWARP)")
    if declared.masked_atomics:
        raise VerbsUnavailable(f"binding {declared.name} has masked FetchAdd, which the verbs API does not reach "
                               "(rdma-bindings §6.4); declare the unmasked profile (ib-rc)")
    if declared.immediate_bytes and info.transport == "iwarp":
        raise VerbsUnavailable(f"binding {declared.name} has {declared.immediate_bytes}-octet Immediate Data, which "
                               f"the iWARP device {info.name} does not carry (no RFC 7306)")
    return declared.with_(mw_type2=declared.mw_type2 and info.windows, pmtu=min(declared.pmtu, info.active_mtu),
                          ord=min(declared.ord, info.max_qp_rd_atom), ird=min(declared.ird, info.max_qp_rd_atom))
