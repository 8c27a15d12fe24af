"""Issue 23's Done-when, over the wire: every KBTP mutant served in its own process over each wire binding its rule
applies to, its checks run from outside, and its failures blame exactly the requirement it breaks.

A target mutant runs as `kvconform serve kbtp-target --binding roce|iwarp --driver-class tests.mutants.kbtp:<Name>`
(its ReferenceTarget subclass, its starting Generation and, for the wire mutants, its broken RNIC model) and is
tested through `kbtp+roce://` / `kbtp+iwarp://`; an initiator mutant runs as a `cmd:` target, `kvconform serve
kbtp-initiator --driver-class ...`, against the harness's target over that wire. The served target declares and
offers the features the mutant's checks need (DIRECT_LOAD, DIRECT_ALLOC, ADDR_LE, and RECORD_COMPLETION on RoCE)
unless the mutant declares its own, with the mutant's PICS as tests/test_mutants_kbtp.py runs it (in-process).

What is not run on a wire is in ONE_BINDING (a rule of the other binding) or UNSERVABLE, and what a wire cannot
show (inconclusive for a documented reason, never a pass) in WIRE_INCONCLUSIVE, and what a black box cannot see (a pass
whose basis says so) in WIRE_UNSEEN, and a check an earlier check's catch keeps from running in the same served
process (inconclusive naming that check) in AFTER_EARLIER, each with its reason; a test pins them, so an exclusion
cannot be added silently. The default run takes SAMPLE (six mutants, ~40 s over two workers);
KVCONFORM_SERVED_MUTANTS_FULL=1 (`tox -e served-mutants`) runs every one.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from kvconform.catalog import load_catalogs
from kvconform.conformance.kbtp import hangs
from kvconform.kbtp.initiator import ReferenceInitiator
from kvconform.kbtp.target import ReferenceTarget
from kvconform.rdma.iwarp.engine import IwarpEngine
from kvconform.targets.kbtp import ReferenceInitiatorDriver, ReferenceTargetDriver
from kvconform.verdicts import GATING_LEVELS
from tests.clean_runs import SLOW_TARGET, WIRE, by_design
from tests.mutants import Mutant
from tests.mutants import kbtp as kbtp_mutants
from tests.mutants.runner import run_suite
from tests.served import served
from tests.spawn import covering

WIRES = ("roce", "iwarp")
PROFILE = {"roce": "ib-rc", "iwarp": "rdmap-7306"}
FEATURES = {"roce": ("DIRECT_LOAD", "DIRECT_ALLOC", "RECORD_COMPLETION", "ADDR_LE"),
            "iwarp": ("DIRECT_LOAD", "DIRECT_ALLOC", "ADDR_LE")}
TICKET_TIMEOUT_MS = 250  # over a wire the ticket checks wait for it in real time (tests/kbtp/test_wire_suites.py)
RUN_TIMEOUT_S = 300
FULL = bool(os.environ.get("KVCONFORM_SERVED_MUTANTS_FULL"))
# The default run's sample: a target mutant on each wire, a wire-engine mutant, an initiator mutant, and two whose
# blame is judged only from outside (a binding a GOODBYE RELEASE left, found by a later check; the first free of a
# partition ring at its initialisation), a few seconds each.
SAMPLE = {("NoQuotaCheck", "roce"), ("StoresIntoSealed", "iwarp"), ("WireIgnoresCrc", "iwarp"),
          ("RequestsWithStatus", "roce"), ("RefusedFreeReleasesQuota", "roce"), ("TailNotWrappedWhenFull", "iwarp")}

# mutant -> (the one wire its rule is judged on, why). Derived below from what the mutant declares (its PICS
# binding) or the checks it names; test_exclusions_are_pinned asserts the table is exactly that.
_RDMAP = "an RDMAP (iWARP) rule: the RoCEv2 binding has no such layer"
_IB = "an IB transport (RoCEv2) rule: its checks need an IB RC binding (PICS binding ib-rc)"
_IWARP_ENGINE = "the mutant breaks its iWARP engine only (iwarp_class): over RoCEv2 it is the reference"
ONE_BINDING: dict[str, tuple[str, str]] = {
    "WireIgnoresCrc": ("iwarp", "MPA's CRC-32C: an iWARP framing rule"),
    "WireSilentOnBadStag": ("iwarp", "DDP tagged-segment errors: an iWARP rule"),
    "WireTakesUnaskedReadResponse": ("iwarp", _RDMAP),
    "WireErrorSpreads": ("iwarp", "its check (test_iwarp_attack) breaks an iWARP stream to see the other sessions "
                                  "survive"),
    # a rule of both bindings, broken in the mutant's iWARP RNIC only: served over RoCEv2 it is the reference
    "WireAtomicBoundsAnswered": ("iwarp", _IWARP_ENGINE),
    "WireWriteStartChecked": ("iwarp", _IWARP_ENGINE),
    "WireReadPastBoundsAnswered": ("iwarp", _IWARP_ENGINE),
    "WireAcceptsBadMpaKey": ("iwarp", "the MPA Request key: an iWARP connection-setup rule"),
    "WireIgnoresMsn": ("iwarp", "DDP untagged MSN: an iWARP rule"),
    "WireTerminateBitfieldsLe": ("iwarp", "the RDMAP Terminate header's bit fields: an iWARP rule"),
    "WireUnmaskedAtomics": ("iwarp", "RFC 7306 masked atomics: an RDMAP rule"),
    "WirePartialFpduRefused": ("iwarp", "MPA stream reassembly: an iWARP rule"),
    "AdvertisesRecordsOnRdmap": ("iwarp", _RDMAP),
    "UnmaskedFetchAddOnRdmap": ("iwarp", _RDMAP),
    "WireIgnoresIcrc": ("roce", _IB),
    "WireAtomicLowBitsIgnored": ("roce", _IB),
    "WirePsnGapExecuted": ("roce", _IB),
    "WireDuplicateAtomicExecuted": ("roce", _IB),
    "WireDuplicateSendDelivered": ("roce", _IB),
    "WireDuplicatedLinkAtomicTwice": ("roce", _IB),
    "WireDuplicateNotAnswered": ("roce", _IB),
    "CompletionInsteadOfRecord": ("roce", "RECORD_COMPLETION exists on the IB binding only"),
    "HeadStartsAtTicketOneUnmasked": ("roce", _IB + " with unmasked FetchAdd"),
    "TailNotWrappedWhenFull": ("iwarp", "the Tail's initial Slot Offset exists in the masked (RFC 7306) layout only: "
                                        "over RoCEv2 (unmasked FetchAdd) the slot is 16 * (u mod N) and the mutant is "
                                        "the reference"),
}
# mutant -> (why its checks can be inconclusive over a wire, the documented reason their message gives: tests/
# clean_runs.py). Served all the same: each named check must fail on the mutant's rule or be inconclusive for that
# reason, never pass, never fail on another rule (tests/test_mutants_kbtp.py catches each in-process).
# None today: WrapsToZeroFromGenerationOne's 2^16 bind/free cycles now reach the wrap over RoCEv2 too (~20 s of
# the check's 150 s, test_widths.py WRAP_WALL_S).
WIRE_INCONCLUSIVE: dict[str, tuple[str, tuple[str, ...]]] = {}
# mutant -> (why a black box cannot see what it breaks, the phrase its check's pass states that with). Its check
# passes from outside, its basis saying what it could not see; tests/test_mutants_kbtp.py catches it in-process.
WIRE_UNSEEN: dict[str, tuple[str, str]] = {
    # test_exposes_only_described_buffers probes around every span a descriptor names (conformance/kbtp/
    # exposure.py); a slot no request ever names has an STag the harness never learns
    "ExposesUnnamedRecordSlot": ("an STag no descriptor names cannot be enumerated by probing from outside",
                                 "cannot be enumerated from outside"),
}
# mutant -> (its named check, why): over the wire that check cannot open a session once an earlier check of the same
# run has failed on the mutant's rule and left the served process holding the sessions whose allocations hang; it is
# inconclusive naming that earlier check (conformance/kbtp/hangs.py open_session), never a pass, and the earlier check
# must have failed on the mutant's rule. In-process each check has a fresh target and catches it.
AFTER_EARLIER: dict[str, tuple[str, str]] = {
    # test_rule_on_every_path's refused ALLOC_STOREs each strand a ticket of the shared ring, the later allocations
    # of three of its cases wait on it for ever, and the served process keeps those sessions (the harness closes
    # their connections, the target refuses their GOODBYE's HELLO as still active): the shared ring's three sessions
    # (quota 2 of 6 blocks) are taken, so every HELLO of test_field_value_classes is refused NO_SPACE
    "OversizeAllocStrandsTicket": ("test_field_value_classes", "test_rule_on_every_path's hung sessions hold the "
                                                               "shared ring's room: its HELLOs are refused (Status 5)"),
}
# mutant -> why it is not served at all (none today: a mutant that cannot be served is first made servable).
UNSERVABLE: dict[str, str] = {}


def _one_binding_by_declaration(name: str, m: Mutant) -> str | None:
    """The wire a mutant's own declaration confines it to: its PICS binding, its checks' or its rule's layer."""
    if any(p == "kbtp.target.binding=ib-rc" for p in m.pics) or all(c.startswith("test_roce_") for c in m.checks):
        return "roce"
    if "kbtp.target.binding=rdmap-7306" in m.pics or all(c.startswith("test_iwarp_") for c in m.checks) \
            or re.search(r"-(MPA|DDP|RDMAP)-|RDMAP$", m.requirement) or name.endswith("OnRdmap"):
        return "iwarp"
    cls = getattr(kbtp_mutants, name)
    if getattr(cls, "iwarp_class", IwarpEngine) is not IwarpEngine and getattr(cls, "target_class", None) is None:
        return "iwarp"  # only its iWARP engine is broken
    return None


def _cases() -> list[tuple[str, str]]:
    return [(n, w) for n in sorted(kbtp_mutants.MUTANTS) if n not in UNSERVABLE for w in WIRES
            if ONE_BINDING.get(n, (w,))[0] == w]


def _marks(name: str, wire: str) -> list[pytest.MarkDecorator]:
    return [pytest.mark.skipif(not FULL and (name, wire) not in SAMPLE, reason="outside the default run's sample; "
                               "KVCONFORM_SERVED_MUTANTS_FULL=1 (tox -e served-mutants) runs it")]


def _pics_value(m: Mutant, key: str) -> str | None:
    for p in m.pics:
        k, _, v = p.partition("=")
        if k == key:
            return v
    return None


def _features(m: Mutant, role: str, wire: str) -> tuple[str, ...]:
    declared = _pics_value(m, f"kbtp.{role}.features")
    if declared is None:
        return FEATURES[wire]
    return tuple(f.strip() for f in declared.strip("[]").split(",") if f.strip())


def _pics(m: Mutant, role: str, wire: str) -> tuple[str, ...]:
    """The mutant's PICS as the in-process lane runs it, on this wire (binding and features its own)."""
    own = tuple(p for p in m.pics if not p.startswith((f"kbtp.{role}.binding=", f"kbtp.{role}.features=")))
    features = ", ".join(_features(m, role, wire))
    pics = (*own, f"kbtp.{role}.binding={PROFILE[wire]}", f"kbtp.{role}.features=[{features}]")
    if role == "target":
        pics = (*pics, "kbtp.target.interleavings=10", f"kbtp.target.ticket_timeout_ms={TICKET_TIMEOUT_MS}")
    else:  # a process per interleaving of the direct-load race (tests/kbtp/test_wire_suites.py)
        pics = (*pics, "kbtp.initiator.interleavings=16")
    return pics


def _serve_args(name: str, m: Mutant, wire: str) -> list[str]:
    """`kvconform serve kbtp-target` serving the mutant as its PICS declare it."""
    args = ["--binding", wire, "--port", "0", "--udp-port", "0", "--profile", PROFILE[wire],
            f"--features={','.join(_features(m, 'target', wire))}", "--ticket-timeout-ms", str(TICKET_TIMEOUT_MS),
            "--driver-class", f"tests.mutants.kbtp:{name}"]
    quota = _pics_value(m, "kbtp.target.quota")
    if quota is not None:
        args += ["--quota", quota]
    untrusted = _pics_value(m, "kbtp.target.untrusted_initiators")
    if untrusted is not None:
        args += ["--untrusted", ",".join(re.findall(r"[0-9a-f]{32}", untrusted))]
    return args


def _judge(name: str, m: Mutant, wire: str, run: object) -> None:
    doc = run.coverage  # type: ignore[attr-defined]
    output = run.output  # type: ignore[attr-defined]
    assert doc, f"{name} over {wire}: no coverage.json\n{output}"
    verdicts = {t["nodeid"].split("::")[-1]: (t["verdict"], t.get("blamed"), t.get("message", "")[:300])
                for t in doc["tests"]}
    failed = {k: b for k, (v, b, _) in verdicts.items() if v == "fail"}
    allowed = {m.requirement, *m.collateral}
    stray = {k: b for k, b in failed.items() if b not in allowed}
    if name in WIRE_INCONCLUSIVE and not stray:
        why, reasons = WIRE_INCONCLUSIVE[name]
        seen = [k for k, (v, b, msg) in verdicts.items() if k.split("[", 1)[0] in m.checks
                and not (v == "fail" and b == m.requirement)
                and not by_design({"verdict": v, "message": msg}, reasons)]
        assert not seen, f"{name} over {wire}: expected caught or inconclusive ({why}), got {verdicts}\n{output}"
        return
    if name in WIRE_UNSEEN and not stray:
        why, phrase = WIRE_UNSEEN[name]
        seen = [k for k, (v, b, msg) in verdicts.items() if k.split("[", 1)[0] in m.checks
                and not (v == "fail" and b == m.requirement) and not (v == "pass" and phrase in msg)]
        assert not seen, f"{name} over {wire}: expected caught or a pass stating {phrase!r} ({why}), got {verdicts}"
        return
    caught = {k.split("[", 1)[0] for k, b in failed.items() if b == m.requirement}
    if name in AFTER_EARLIER and caught and AFTER_EARLIER[name][0] not in caught:
        held, why = AFTER_EARLIER[name]
        earlier = [k for k, b in failed.items() if b == m.requirement]
        runs = [t for t in doc["tests"] if t["nodeid"].split("::")[-1].split("[", 1)[0] == held]
        named = [t for t in runs if t["verdict"] == "inconclusive" and hangs.HELD_BY_EARLIER in t.get("message", "")
                 and any(e in t["message"] for e in earlier)]
        assert named and all(t in named or t["verdict"] == "not-applicable" for t in runs), (
            f"{name} over {wire}: {held} expected caught or inconclusive naming an earlier check that failed on "
            f"{m.requirement} ({why}), got {verdicts}\n{output}")
        caught.add(held)
    # a named check not applicable to the served geometry or binding is no miss when another named one fails on it
    na = {k.split("[", 1)[0] for k, (v, _, _) in verdicts.items() if v == "not-applicable"}
    missed = [c for c in m.checks if c not in caught and not (caught and c in na)]
    if missed and not stray:
        raise AssertionError(f"MISSED: {name} over kbtp+{wire}:// breaks {m.requirement}; {missed} did not fail on "
                             f"it: {verdicts}\n{output}")
    assert not stray and not missed, (f"OTHER RULE: {name} over kbtp+{wire}:// breaks {m.requirement}, failures "
                                      f"blame {failed}; verdicts {verdicts}\n{output}")
    gating = load_catalogs().get(m.requirement).level in GATING_LEVELS
    assert run.code == (1 if gating else 0), f"{name} over {wire}: exit {run.code}\n{output}"  # type: ignore


@pytest.mark.slow
@covering(RUN_TIMEOUT_S)
@pytest.mark.parametrize(("name", "wire"), [pytest.param(n, w, marks=_marks(n, w), id=f"{n}-{w}")
                                            for n, w in _cases()])
def test_served_mutant_fails_on_its_rule(name: str, wire: str, tmp_path: Path) -> None:
    m = kbtp_mutants.MUTANTS[name]
    if m.suite == "kbtp-target":
        with served("kbtp-target", *_serve_args(name, m, wire)) as address:
            run = run_suite(m.suite, f"kbtp+{wire}://{address}", tmp_path, pics=_pics(m, "target", wire),
                            checks=m.checks, timeout=RUN_TIMEOUT_S)
    else:
        # no {initiator_id}: the process generates its own (a handed one would hide KBTP-HELLO-ID-ENTROPY)
        template = (f"cmd:{sys.executable} -m kvconform serve kbtp-initiator --target {{target}} --profile "
                    f"{PROFILE[wire]} --features={{features}} "
                    f"--driver-class tests.mutants.kbtp:{name}")
        run = run_suite(m.suite, template, tmp_path, pics=_pics(m, "initiator", wire), checks=m.checks,
                        timeout=RUN_TIMEOUT_S)
    _judge(name, m, wire, run)


def test_exclusions_are_pinned() -> None:
    """ONE_BINDING is exactly the mutants whose declaration confines them to one wire, and UNSERVABLE only names
    mutants no served component can start: the exclusions cannot grow silently."""
    derived = {n: w for n, m in kbtp_mutants.MUTANTS.items() if (w := _one_binding_by_declaration(n, m))}
    assert {n: w for n, (w, _) in ONE_BINDING.items()} == derived
    assert all(reason for _, reason in ONE_BINDING.values())
    assert set(WIRE_INCONCLUSIVE) <= set(kbtp_mutants.MUTANTS)
    # each reason is one tests/clean_runs.py documents as unobservable over a wire (or on a slow target)
    assert all(why and set(reasons) <= {*WIRE, *SLOW_TARGET} for why, reasons in WIRE_INCONCLUSIVE.values())
    assert all(c in kbtp_mutants.MUTANTS[n].checks and why for n, (c, why) in AFTER_EARLIER.items())
    assert len(AFTER_EARLIER) == 1, "a new check a served mutant's earlier catch keeps from running: say why here"
    assert not set(AFTER_EARLIER) & (set(WIRE_INCONCLUSIVE) | set(WIRE_UNSEEN))
    assert len(WIRE_INCONCLUSIVE) == 0, "a new wire-inconclusive mutant: make it observable, or say why here"
    assert set(WIRE_UNSEEN) <= set(kbtp_mutants.MUTANTS) and not set(WIRE_UNSEEN) & set(WIRE_INCONCLUSIVE)
    assert len(WIRE_UNSEEN) == 1, "a new mutant a black box cannot see: make it observable, or say why here"
    for name, reason in UNSERVABLE.items():
        cls = getattr(kbtp_mutants, name)
        assert reason and not issubclass(cls, (ReferenceTargetDriver, ReferenceInitiatorDriver)), name
    for name in kbtp_mutants.MUTANTS:
        cls = getattr(kbtp_mutants, name)
        own = getattr(cls, "target_class", None) or getattr(cls, "initiator_class", None)
        assert own is None or issubclass(own, (ReferenceTarget, ReferenceInitiator)), name
    assert len(_cases()) == 2 * len(kbtp_mutants.MUTANTS) - len(ONE_BINDING) - 2 * len(UNSERVABLE)
    assert set(_cases()) >= SAMPLE
