"""Wire attacks: one field at a time, the hostile or broken input the RFCs the text defers to say an RNIC must
refuse, aimed at a target reached over a wire binding (``kbtp+iwarp://``, ``kbtp+roce://`` or ``--kbtp-wire``).
Catalog section "Wire bindings" (sources: rdma-bindings.md §2-§4).

Each case opens a victim session that stores a block, an attacker session whose connection carries the crafted
frame, checks the answer the RFCs require (a Terminate of the right Layer/EType/Code, or a silent drop), then a
fresh session stores, loads and frees a block and the victim's block still loads as stored (KBTP-WIRE-INTACT).
A Terminate's Layer and EType read nibble-swapped are the expected error (kvconform.conformance.kbtp.terminate):
the header layout is KBTP-WIRE-TERMINATE-HEADER's, judged in test_wire_attacks.py.
On the emulated fabric there is no wire to attack: not-applicable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from kvconform.conformance.kbtp.terminate import accepted
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import Status
from kvconform.kbtp.messages import Free
from kvconform.rdma import ConnState, Op, wait_completion_for, wait_until
from kvconform.rdma.iwarp import ddp, mpa
from kvconform.rdma.iwarp.rdmap import Opcode as RdmapOpcode
from kvconform.rdma.roce.headers import Bth, Opcode, Packet
from kvconform.rdma.roce.icrc import append_icrc
from kvconform.targets.kbtp_bed import Bed
from kvconform.targets.kbtp_client import Gen, HarnessInitiator
from kvconform.verdicts import check, check_equal, inconclusive, not_applicable

ANSWER_S = 3.0  # how long the harness waits for the target's answer to an attack (real time)
SILENCE_S = 1.0  # ... and how long a dropped packet must stay unanswered
VICTIM_DATA = b"victim block, stored before the attack" * 4
UNADVERTISED_STAG = 0xFFFFFF5A  # an index no target hands out this early, with a key byte
MPA_CRC_ERROR = 2  # LLP (EType 0) Code 2 (rdma-bindings §2.6)


def _wire(bed: Bed, binding: str) -> Any:
    fabric = bed.fabric
    if getattr(fabric, "binding", None) is None:
        not_applicable("the wire attacks need a target reached over a wire binding (kbtp+iwarp://, kbtp+roce:// or "
                       "--kbtp-wire); on the emulated fabric there is no wire")
    if fabric.binding != binding:
        not_applicable(f"an attack on the {binding} wire; this target is reached over {fabric.binding}")
    if not getattr(fabric, "crafts_frames", True):
        inconclusive(f"the harness's initiators are on {fabric!r}, whose device builds every packet itself, so "
                     "no crafted frame can be sent: run the attacks from the userspace binding (kbtp+iwarp:// or "
                     "kbtp+roce:// from a host without the device; .ci/rdma aims them at rxe and siw)")
    unimpaired = getattr(fabric, "impair", None)
    if unimpaired is not None:
        # each attack judges one answer (a NAK, a Terminate) that RC and TCP never send twice: a wire impaired by
        # --impair would lose it and blame the target, so the attacks run on unimpaired links (the impairment
        # checks, test_wire_faults.py, judge the target under faults)
        unimpaired(None)
    return fabric


def _session(bed: Bed, name: str) -> Gen:
    ini = bed.initiator(name)
    yield from bed.open(ini, bed.room())
    return ini


def _victim(bed: Bed) -> Gen:
    """A session that stores a sealed block before the attack (its handle and data are checked after it)."""
    v = yield from _session(bed, "V")
    r = yield from v.alloc_store(v.handle(0), VICTIM_DATA, req="KBTP-WIRE-INTACT")
    check(r.status == Status.OK, f"the victim's ALLOC_STORE before the attack failed: {r}", req="KBTP-WIRE-INTACT")
    return v


def _intact(bed: Bed, victim: HarnessInitiator) -> Gen:
    """After the attack: the victim's block loads as stored, and a fresh session stores, loads and frees one."""
    r, got = yield from victim.load(victim.handle(0), len(VICTIM_DATA), req="KBTP-WIRE-INTACT")
    check(r.status == Status.OK, f"after the attack the victim's LOAD failed: {r}", req="KBTP-WIRE-INTACT")
    check_equal("the victim's block after the attack", got, VICTIM_DATA, req="KBTP-WIRE-INTACT")
    fresh = yield from _session(bed, "C")
    data = b"fresh session after the attack"
    r = yield from fresh.alloc_store(fresh.handle(0), data, req="KBTP-WIRE-INTACT")
    check(r.status == Status.OK, f"a fresh session's ALLOC_STORE after the attack failed: {r}", req="KBTP-WIRE-INTACT")
    r, got = yield from fresh.load(fresh.handle(0), len(data), req="KBTP-WIRE-INTACT")
    check(r.status == Status.OK and got == data, f"a fresh session's LOAD after the attack: {r}, {got!r}",
          req="KBTP-WIRE-INTACT")
    r = yield from fresh.free(fresh.handle(0), req="KBTP-WIRE-INTACT")
    check(r.status == Status.OK, f"a fresh session's FREE after the attack failed: {r}", req="KBTP-WIRE-INTACT")


def _ended(conn: Any) -> Gen:
    ended = yield from wait_until(lambda: conn.state is not ConnState.CONNECTED, name="attack-answer",
                                  timeout=ANSWER_S)
    return ended


# ---- iWARP ----------------------------------------------------------------------------------------------


def _free_request(a: HarnessInitiator) -> bytes:
    """A valid request of the attacker's session (FREE of its own unbound handle): harmless if it is refused as
    it must be, answered with a COMPLETION if a target processes the frame that carries it."""
    return a.enc(Free(request_id=0xA77AC, handle=a.handle(1), generation=0))


def _iwarp_send(a: HarnessInitiator, payload: bytes) -> bytes:
    engine = a.conn.engine  # type: ignore[attr-defined]
    seg = ddp.Segment(False, True, RdmapOpcode.SEND, payload, qn=ddp.QN_SEND, msn=engine.msn_out[ddp.QN_SEND])
    return seg.encode()


def _bad_crc(a: HarnessInitiator) -> bytes:
    fpdu = mpa.encode_fpdu(_iwarp_send(a, _free_request(a)))
    return fpdu[:-4] + bytes(b ^ 0xFF for b in fpdu[-4:])


def _write_unadvertised(a: HarnessInitiator) -> bytes:
    return mpa.encode_fpdu(ddp.Segment(True, True, RdmapOpcode.WRITE, b"x" * 16, stag=UNADVERTISED_STAG, to=0).encode())


def _read_response_unasked(a: HarnessInitiator) -> bytes:
    return mpa.encode_fpdu(ddp.Segment(True, True, RdmapOpcode.READ_RESPONSE, b"y" * 16, stag=UNADVERTISED_STAG,
                                       to=0).encode())


@dataclass(frozen=True)
class Attack:
    """One crafted frame and what the target must answer: a Terminate with ``key`` (any Terminate when None) or,
    for ``llp``, a Terminate of Layer LLP or the stream closed."""

    name: str
    req: str
    frame: Callable[[HarnessInitiator], bytes]
    key: tuple[int, int, int] | None = None
    llp: bool = False


IWARP_ATTACKS = [
    Attack("bad-fpdu-crc", "KBTP-WIRE-MPA-CRC", _bad_crc, llp=True),
    Attack("write-unadvertised-stag", "KBTP-WIRE-DDP-TAGGED", _write_unadvertised, key=(1, 1, 0)),
    Attack("read-response-never-asked", "KBTP-WIRE-RDMAP-UNEXPECTED", _read_response_unasked),
]


@pytest.mark.req("KBTP-WIRE-MPA-CRC", "KBTP-WIRE-DDP-TAGGED", "KBTP-WIRE-RDMAP-UNEXPECTED", "KBTP-WIRE-INTACT",
                 "KBTP-HELLO-FIRST")
@pytest.mark.parametrize("attack", IWARP_ATTACKS, ids=lambda a: a.name)
def test_iwarp_attack(kbtp_target: TargetUnderTest, seed: int, attack: Attack) -> None:
    """The crafted FPDU ends the attacker's stream with the Terminate the RFC names, and nothing else changes."""
    bed = kbtp_target.bed(seed, label=f"wire-{attack.name}")
    fabric = _wire(bed, "iwarp")

    def scenario() -> Gen:
        victim = yield from _victim(bed)
        a = yield from _session(bed, "A")
        fabric.inject(a.conn, attack.frame(a))
        ended = yield from _ended(a.conn)
        term = a.conn.terminate
        if attack.llp:
            # a Terminate of Layer LLP, any Code; or the MPA CRC error (2, 0, 2) read nibble-swapped as (0, 2, 2),
            # which names no error (RDMAP Remote Operation has no Code 2: terminate.py DEFINED)
            llp = term is not None and (term.layer == 2 or accepted(term, {2}, {0}, {MPA_CRC_ERROR}, attack.name))
            check(ended and (term is None or llp), f"{attack.name}: the stream was not ended with a Terminate of "
                  f"Layer LLP within {ANSWER_S:g} s (state {a.conn.state}, Terminate {term})", req=attack.req)
        else:
            check(ended and term is not None, f"{attack.name}: no Terminate within {ANSWER_S:g} s (state "
                  f"{a.conn.state})", req=attack.req)
            if attack.key is not None and term is not None:
                # (1, 1, Code): Layer and EType are equal, so a nibble swap reads the same octet
                layer, etype, code = attack.key
                check(accepted(term, {layer}, {etype}, {code}, attack.name), f"{attack.name}: Terminate (Layer, "
                      f"EType, Code) {term.key()}, the rule requires {attack.key} ({term.reason})", req=attack.req)
        yield from _intact(bed, victim)

    bed.run_one(scenario())


# ---- RoCEv2 ---------------------------------------------------------------------------------------------


def _roce_send(a: HarnessInitiator, *, icrc_ok: bool = True, p_key: int | None = None, qpn_delta: int = 0) -> bytes:
    e = a.conn.engine  # type: ignore[attr-defined]
    bth = Bth(Opcode.SEND_ONLY, (e.remote.qpn + qpn_delta) & 0xFFFFFF, e._next_psn, ack_req=True,
              p_key=e.p_key if p_key is None else p_key)
    raw = append_icrc(e.local.ip, e.local.port, e.remote.ip, e.remote.port,
                      Packet(bth, payload=_free_request(a)).encode())
    return raw[:-4] + bytes(b ^ 0xFF for b in raw[-4:]) if not icrc_ok else raw


ROCE_DROPS = {
    "bad-icrc": lambda a: _roce_send(a, icrc_ok=False),
    "wrong-p-key": lambda a: _roce_send(a, p_key=0x7123),
    "wrong-destination-qp": lambda a: _roce_send(a, qpn_delta=1),
}


@pytest.mark.req("KBTP-WIRE-IB-DROP", "KBTP-WIRE-INTACT", "KBTP-HELLO-FIRST")
@pytest.mark.parametrize("case", sorted(ROCE_DROPS))
def test_roce_packet_dropped(kbtp_target: TargetUnderTest, seed: int, case: str) -> None:
    """A packet that is not the connection's (bad ICRC, foreign P_Key, another QP) is dropped: no answer comes,
    the connection goes on (the next request is served), and nothing else changes."""
    bed = kbtp_target.bed(seed, label=f"wire-{case}")
    fabric = _wire(bed, "roce")

    def scenario() -> Gen:
        victim = yield from _victim(bed)
        a = yield from _session(bed, "A")
        fabric.inject(a.conn, ROCE_DROPS[case](a))
        answer = yield from wait_completion_for(a.conn.cq, SILENCE_S, lambda c: c.op is Op.RECV or not c.ok,
                                                name="silence")
        check(answer is None, f"{case}: the target answered the packet ({answer})", req="KBTP-WIRE-IB-DROP")
        r = yield from a.alloc_store(a.handle(2), b"after the dropped packet", req="KBTP-WIRE-IB-DROP")
        check(r.status == Status.OK, f"{case}: the connection's next request after the dropped "
              f"packet was not served: {r}", req="KBTP-WIRE-IB-DROP")
        yield from _intact(bed, victim)

    bed.run_one(scenario())
