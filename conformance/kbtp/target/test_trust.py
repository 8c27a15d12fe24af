"""kbtp-target: direct modes only for initiators the target trusts, checked against the trust policy it declares
(KBTP "Direct Modes", "Security Considerations"; PICS kbtp.target.untrusted_initiators).

Nothing on the wire says whom a target trusts, so the check needs the declaration: the Initiator IDs the target is
configured not to trust. Such an initiator asking for every feature must be offered no direct mode and no STag of
the table, pool, partition, ring or Head, alone and while a trusted session is active; a trusted one (an unlisted ID
one octet away from a listed one, where an implementation that compares IDs on part of their 128 bits goes wrong)
gets the direct features the target declares."""

from __future__ import annotations

import pytest

from kvconform import evidence, sweep
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import HEADER_SIZE, HELLO_ACK_FIXED_SIZE, Features
from kvconform.kbtp.messages import HelloAck
from kvconform.targets.kbtp_bed import Bed
from kvconform.targets.kbtp_client import Gen, HarnessInitiator
from kvconform.verdicts import check, check_equal, not_applicable

DIRECT = Features.DIRECT_LOAD | Features.DIRECT_ALLOC
ASK_ALL = Features(0xF)
PICS_PATH = "kbtp.target.untrusted_initiators"
MAX_IDS = 8  # declared IDs probed; each is a fresh target and a few HELLOs
# The octet of a listed ID that a trusted control ID flips: the last (an ID compared on its first 8 octets) and the
# first (compared on its last 8); --sweep wide adds the middle ones.
FLIPPED_OCTETS = sweep.pick([15, 0], [7, 8])


def _near(iid: bytes, octet: int) -> bytes:
    out = bytearray(iid)
    out[octet] ^= 0x01
    return bytes(out)


def _judge_untrusted(ini: HarnessInitiator, ack: HelloAck, when: str) -> None:
    """No direct mode and no direct-mode descriptor for a declared-untrusted initiator (a refusal exposes nothing
    either: the text lets a target refuse a session)."""
    iid = ini.initiator_id.hex()
    evidence.note(f"untrusted Initiator ID {iid} ({when}): HELLO_ACK Status {ack.status}, Features "
                  f"{int(ack.features):#06x}")
    granted = Features(ack.features) & DIRECT
    check(not granted, f"HELLO_ACK Features at offset 24 ({when}) offer {granted!r} to Initiator ID {iid}, which PICS "
          f"{PICS_PATH} declares the target does not trust", req="KBTP-DIRECT-TRUST", seen=Features(ack.features),
          expected="neither DIRECT_LOAD nor DIRECT_ALLOC")
    size = len(ini.replies[-1].raw)
    fixed = HEADER_SIZE + HELLO_ACK_FIXED_SIZE
    check(size <= fixed, f"HELLO_ACK to untrusted Initiator ID {iid} ({when}) carries {size - fixed} octets past the "
          "fixed Target Descriptor: direct-mode descriptors (STags of the table, pool, partition, ring or Head)",
          req="KBTP-DIRECT-TRUST", seen=size, expected=f"<= {fixed} octets")


def _expected_direct(kbtp_target: TargetUnderTest) -> Features | None:
    """The direct features a trusted initiator asking for all must get: those declared (DIRECT_ALLOC when the
    declared geometry has a partition for it), less those the geometry leaves to the target (compared on neither
    side); None when the features are not declared (a default is no claim)."""
    if not kbtp_target.features_declared:
        return None
    p = kbtp_target.params
    return Features(p.sure_grants & DIRECT)


@pytest.mark.req("KBTP-DIRECT-TRUST", "KBTP-ACK-FEATURES", "KBTP-HELLO-FIRST")
def test_no_direct_mode_for_untrusted_initiators(kbtp_target: TargetUnderTest, seed: int) -> None:
    """Each declared-untrusted Initiator ID, asking for every feature, is offered neither DIRECT_LOAD nor
    DIRECT_ALLOC nor any direct-mode descriptor: on a fresh target, and again after a trusted initiator (an
    unlisted ID one octet away from it) has opened its session, which gets the declared direct features."""
    untrusted = kbtp_target.params.untrusted_initiators
    if not untrusted or kbtp_target.pics.is_defaulted(PICS_PATH):
        not_applicable(f"PICS {PICS_PATH} not declared: nothing says which initiators the target does not trust")
    expected = _expected_direct(kbtp_target)
    listed = set(untrusted)
    for n, uid in enumerate(untrusted[:MAX_IDS]):
        bed = kbtp_target.bed(seed + n, label=f"trust-{n}")
        alone = bed.initiator("U", initiator_id=uid)
        _judge_untrusted(alone, bed.run_one(alone.hello(ASK_ALL)), "fresh target")
        for octet in FLIPPED_OCTETS:
            tid = _near(uid, octet)
            if tid not in listed:
                _trusted_then_untrusted(kbtp_target, seed + n, uid, tid, octet, expected)


def _trusted_then_untrusted(kbtp_target: TargetUnderTest, seed: int, uid: bytes, tid: bytes, octet: int,
                            expected: Features | None) -> None:
    bed: Bed = kbtp_target.bed(seed, label=f"trust-{uid.hex()[:8]}-{octet}")
    trusted = bed.initiator("T", initiator_id=tid)
    untrusted = bed.initiator("U", initiator_id=uid)

    def scenario() -> Gen:
        t_ack = yield from bed.open(trusted, ASK_ALL)
        u_ack = yield from untrusted.hello(ASK_ALL)
        return t_ack, u_ack

    t_ack, u_ack = bed.run_one(scenario())
    if expected is not None:
        check_equal(f"HELLO_ACK direct features (offset 24) for trusted Initiator ID {tid.hex()} (octet {octet} of "
                    f"an untrusted one flipped) vs PICS kbtp.target.features",
                    Features(t_ack.features & DIRECT & ~kbtp_target.params.grant_optional),
                    expected, req="KBTP-ACK-FEATURES")
    _judge_untrusted(untrusted, u_ack, f"after trusted {tid.hex()} opened its session")
