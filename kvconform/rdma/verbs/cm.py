"""rdma_cm for the verbs binding, through librdmacm with ctypes (rdma-bindings §5.3, §6.3).

Why not ``pyverbs.cmid``: its synchronous calls (``get_request``, ``connect``) block inside the extension
holding the GIL, so a listener and a dialer cannot share one process, and a served target could not run its
actors while it waits for the next connection. librdmacm's event channel is a file descriptor; made
non-blocking and watched by the wire fabric's selector it turns connection setup into events like any other
socket. ctypes releases the GIL around each call.

The QP is the fabric's own (a pyverbs QP on the same device, an "external QP" in librdmacm terms): its number
travels in ``rdma_conn_param.qp_num``, and for iWARP the kernel's iw_cm finds it by number on the device and
moves it to RTS when MPA completes. That keeps one PD, CQ and QP per connection whatever the transport.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

RDMA_PS_TCP = 0x0106
TIMEOUT_MS = 2000  # address and route resolution (local: the address lives on this host)


class CmEvent:
    """``enum rdma_cm_event_type`` (librdmacm rdma_cma.h)."""

    ADDR_RESOLVED = 0
    ADDR_ERROR = 1
    ROUTE_RESOLVED = 2
    ROUTE_ERROR = 3
    CONNECT_REQUEST = 4
    CONNECT_RESPONSE = 5
    CONNECT_ERROR = 6
    UNREACHABLE = 7
    REJECTED = 8
    ESTABLISHED = 9
    DISCONNECTED = 10
    DEVICE_REMOVAL = 11
    TIMEWAIT_EXIT = 15

    NAMES: ClassVar[dict[int, str]] = {
        0: "ADDR_RESOLVED", 1: "ADDR_ERROR", 2: "ROUTE_RESOLVED", 3: "ROUTE_ERROR", 4: "CONNECT_REQUEST",
        5: "CONNECT_RESPONSE", 6: "CONNECT_ERROR", 7: "UNREACHABLE", 8: "REJECTED", 9: "ESTABLISHED",
        10: "DISCONNECTED", 11: "DEVICE_REMOVAL", 14: "ADDR_CHANGE", 15: "TIMEWAIT_EXIT"}


class _SockaddrIn(ctypes.Structure):
    _fields_ = [("family", ctypes.c_uint16), ("port", ctypes.c_uint16), ("addr", ctypes.c_uint8 * 4),
                ("zero", ctypes.c_uint8 * 8)]


class _ConnParam(ctypes.Structure):
    _fields_ = [("private_data", ctypes.c_void_p), ("private_data_len", ctypes.c_uint8),
                ("responder_resources", ctypes.c_uint8), ("initiator_depth", ctypes.c_uint8),
                ("flow_control", ctypes.c_uint8), ("retry_count", ctypes.c_uint8),
                ("rnr_retry_count", ctypes.c_uint8), ("srq", ctypes.c_uint8), ("qp_num", ctypes.c_uint32)]


class _Event(ctypes.Structure):
    # only the leading members are read; the library owns (and sizes) the event
    _fields_ = [("id", ctypes.c_void_p), ("listen_id", ctypes.c_void_p), ("event", ctypes.c_int),
                ("status", ctypes.c_int), ("conn", _ConnParam)]


class CmError(OSError):
    """A librdmacm call failed: names the call and errno."""


def _load() -> Any:
    name = ctypes.util.find_library("rdmacm") or "librdmacm.so.1"
    lib = ctypes.CDLL(name, use_errno=True)
    vp, ip = ctypes.c_void_p, ctypes.c_int
    sig: dict[str, tuple[Any, list[Any]]] = {
        "rdma_create_event_channel": (vp, []),
        "rdma_destroy_event_channel": (None, [vp]),
        "rdma_create_id": (ip, [vp, ctypes.POINTER(vp), vp, ip]),
        "rdma_destroy_id": (ip, [vp]),
        "rdma_bind_addr": (ip, [vp, vp]),
        "rdma_listen": (ip, [vp, ip]),
        "rdma_resolve_addr": (ip, [vp, vp, vp, ip]),
        "rdma_resolve_route": (ip, [vp, ip]),
        "rdma_connect": (ip, [vp, ctypes.POINTER(_ConnParam)]),
        "rdma_accept": (ip, [vp, ctypes.POINTER(_ConnParam)]),
        "rdma_reject": (ip, [vp, vp, ctypes.c_uint8]),
        "rdma_disconnect": (ip, [vp]),
        "rdma_get_cm_event": (ip, [vp, ctypes.POINTER(ctypes.POINTER(_Event))]),
        "rdma_ack_cm_event": (ip, [ctypes.POINTER(_Event)]),
        "rdma_get_src_port": (ctypes.c_uint16, [vp]),
    }
    for fn, (res, args) in sig.items():
        f = getattr(lib, fn)
        f.restype, f.argtypes = res, args
    return lib


def _sockaddr(host: str, port: int) -> _SockaddrIn:
    sa = _SockaddrIn()
    sa.family = socket.AF_INET
    sa.port = socket.htons(port)
    sa.addr[:] = list(socket.inet_aton(host))
    return sa


@dataclass(frozen=True, slots=True)
class Event:
    """One rdma_cm event, copied out of the library's (which is acknowledged at once)."""

    kind: int
    status: int
    id: int  # the rdma_cm_id it concerns (for CONNECT_REQUEST: the new id of the incoming connection)
    listen_id: int

    @property
    def name(self) -> str:
        return CmEvent.NAMES.get(self.kind, str(self.kind))


class EventChannel:
    """One rdma_event_channel, non-blocking; ``fd`` goes into a selector, `drain` returns what arrived."""

    def __init__(self) -> None:
        self.lib = _load()
        self._ch = self.lib.rdma_create_event_channel()
        if not self._ch:
            raise CmError(ctypes.get_errno(), f"rdma_create_event_channel: {os.strerror(ctypes.get_errno())}")
        self.fd = ctypes.cast(self._ch, ctypes.POINTER(ctypes.c_int))[0]  # struct rdma_event_channel { int fd; }
        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        self._ids: set[int] = set()
        self._keep: list[Any] = []  # sockaddrs and params librdmacm may read after the call returned

    def _check(self, rc: int, call: str) -> None:
        if rc:
            err = ctypes.get_errno()
            raise CmError(err, f"{call}: {os.strerror(err)}")

    def create_id(self) -> int:
        out = ctypes.c_void_p()
        self._check(self.lib.rdma_create_id(self._ch, ctypes.byref(out), None, RDMA_PS_TCP), "rdma_create_id")
        assert out.value is not None
        self._ids.add(out.value)
        return out.value

    def adopt(self, cm_id: int) -> None:
        """An id the library created for an incoming connection: destroyed with the channel."""
        self._ids.add(cm_id)

    def listen(self, cm_id: int, host: str, port: int, backlog: int = 16) -> int:
        sa = _sockaddr(host, port)
        self._check(self.lib.rdma_bind_addr(cm_id, ctypes.byref(sa)), f"rdma_bind_addr {host}:{port}")
        self._check(self.lib.rdma_listen(cm_id, backlog), "rdma_listen")
        return socket.ntohs(self.lib.rdma_get_src_port(cm_id))

    def resolve_addr(self, cm_id: int, host: str, port: int, src: str | None = None) -> None:
        dst = _sockaddr(host, port)
        local = _sockaddr(src, 0) if src else None
        self._keep += [dst, local]
        self._check(self.lib.rdma_resolve_addr(cm_id, ctypes.byref(local) if local else None, ctypes.byref(dst),
                                               TIMEOUT_MS), f"rdma_resolve_addr {host}:{port}")

    def resolve_route(self, cm_id: int) -> None:
        self._check(self.lib.rdma_resolve_route(cm_id, TIMEOUT_MS), "rdma_resolve_route")

    @staticmethod
    def _param(qp_num: int, depth: int) -> _ConnParam:
        p = _ConnParam()
        p.qp_num = qp_num
        p.responder_resources = p.initiator_depth = depth  # IRD and ORD (RFC 6581 in MPA rev 2)
        p.retry_count = 7
        p.rnr_retry_count = 7
        return p

    def connect(self, cm_id: int, qp_num: int, depth: int) -> None:
        p = self._param(qp_num, depth)
        self._keep.append(p)
        self._check(self.lib.rdma_connect(cm_id, ctypes.byref(p)), "rdma_connect")

    def accept(self, cm_id: int, qp_num: int, depth: int) -> None:
        p = self._param(qp_num, depth)
        self._keep.append(p)
        self._check(self.lib.rdma_accept(cm_id, ctypes.byref(p)), "rdma_accept")

    def reject(self, cm_id: int) -> None:
        self.lib.rdma_reject(cm_id, None, 0)

    def disconnect(self, cm_id: int) -> None:
        self.lib.rdma_disconnect(cm_id)  # ENOTCONN / EINVAL when already down: nothing to do

    def destroy_id(self, cm_id: int) -> None:
        if cm_id in self._ids:
            self._ids.discard(cm_id)
            self.lib.rdma_destroy_id(cm_id)

    def drain(self, handle: Callable[[Event], None]) -> int:
        """Hand every pending event to ``handle`` (acknowledged first); the number handled."""
        n = 0
        while True:
            ev = ctypes.POINTER(_Event)()
            if self.lib.rdma_get_cm_event(self._ch, ctypes.byref(ev)):
                err = ctypes.get_errno()
                if err in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                    return n
                raise CmError(err, f"rdma_get_cm_event: {os.strerror(err)}")
            c = ev.contents
            event = Event(int(c.event), int(c.status), int(c.id or 0), int(c.listen_id or 0))
            self.lib.rdma_ack_cm_event(ev)
            n += 1
            handle(event)

    def close(self) -> None:
        for cm_id in list(self._ids):
            self.destroy_id(cm_id)
        if self._ch:
            self.lib.rdma_destroy_event_channel(self._ch)
            self._ch = None
        self._keep.clear()
