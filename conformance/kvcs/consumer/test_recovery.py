"""kvcs-consumer: missing objects, recovery through another relay and the time budget (KVCS "Verification
and Recovery": retry with another relay or publication; "It does not wait indefinitely")."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvconform import evidence, sweep
from kvconform.conformance.kvcs.consumer.checks import LAYERS, data_requests, digest_findings, run, small_spec
from kvconform.conformance.kvcs.consumer.harness import (
    SLACK,
    GapRelay,
    HarnessPublisher,
    RecordingRelay,
    ResetRelay,
    Stage,
    poisoned_layers_reported_good,
)
from kvconform.fixtures.kvcs.consumer import DEFAULT_BUDGET
from kvconform.kvcs.namespace import new_publication_id
from kvconform.verdicts import Findings, check, inconclusive

RELAYS = {"end-of-range": GapRelay, "reset": ResetRelay}
KINDS = ["end-of-range", "reset"]
# End of Range records (absolute Group and Object ID) read as missing data: a subscriber's decoding rule.
KINDS_DECODED = [pytest.param("end-of-range", marks=pytest.mark.req("MOQT-FETCH-OBJECT-ENCODING")), "reset"]
MISSING = 1  # the layer the misbehaving relays do not deliver


@pytest.mark.req("KVCS-RECOVER-RETRY", "KVCS-VERIFY-LAYER-USABLE")
@pytest.mark.parametrize("misbehaviour", KINDS)
def test_missing_objects_are_recovered_through_another_relay(kvcs_consumer: object, seed: int, tmp_path: Path,
                                                             misbehaviour: str) -> None:
    """The same publication reaches two relays; the first one's fills and FETCHes miss layer 1 (End of
    Unknown Range records, or the stream reset). Given both relay URLs, the consumer gets every layer."""
    kvcs_consumer.require("fallback_relay")  # type: ignore[attr-defined]
    spec = small_spec(seed)
    pub_id = new_publication_id()
    pubs = [(HarnessPublisher(spec, pub_id=pub_id), (0,)), (HarnessPublisher(spec, pub_id=pub_id), (1,))]
    stage = Stage(spec, list(pubs), relays=(RELAYS[misbehaviour], RecordingRelay), relays_given=(0, 1))
    outcome = run(kvcs_consumer, stage, tmp_path, f"{misbehaviour} on the first relay")
    found = Findings(f"{misbehaviour} on the first relay: not every layer recovered through the second")
    digest_findings(found, outcome, spec, list(range(LAYERS)), missing="KVCS-RECOVER-RETRY",
                    wrong="KVCS-VERIFY-LAYER-USABLE")
    found.judge()


@pytest.mark.req("KVCS-VERIFY-LAYER-USABLE", "KVCS-RECOVER-NO-INDEFINITE-WAIT")
@pytest.mark.parametrize("misbehaviour", KINDS_DECODED)
def test_missing_objects_fail_their_layer(kvcs_consumer: object, seed: int, tmp_path: Path,
                                          misbehaviour: str) -> None:
    """Only the misbehaving relay: layer 1 cannot be had. The consumer reports it failed (never assembled
    from what it lacks), the other layers assembled, within its budget."""
    spec = small_spec(seed)
    stage = Stage(spec, [(HarnessPublisher(spec), (0,))], relays=(RELAYS[misbehaviour],))
    outcome = run(kvcs_consumer, stage, tmp_path, f"{misbehaviour}, no other relay")
    found = Findings(f"{misbehaviour}, no other relay: the missing layer is not reported failed, or the rest lost")
    for problem in poisoned_layers_reported_good(outcome, spec):
        found.add("KVCS-VERIFY-LAYER-USABLE", problem)
    result = outcome.require_result()
    found.expect(result.layers.get(MISSING) is None, "KVCS-VERIFY-LAYER-USABLE",
                 f"layer {MISSING} reported assembled although the only relay never delivered it")
    if misbehaviour == "end-of-range":
        # (a reset stream may lose what it carried before the reset too: RESET_STREAM discards unread data)
        digest_findings(found, outcome, spec, [0, 2, 3], missing="MOQT-FETCH-OBJECT-ENCODING",
                        wrong="KVCS-VERIFY-LAYER-USABLE")
    if outcome.budget_known:
        found.expect(outcome.run.elapsed <= outcome.budget + SLACK, "KVCS-RECOVER-NO-INDEFINITE-WAIT",
                     f"took {outcome.run.elapsed:.1f} s with a budget of {outcome.budget:g} s")
    else:
        found.expect(not outcome.run.killed, "KVCS-RECOVER-NO-INDEFINITE-WAIT",
                     f"still running {outcome.run.elapsed:.1f} s after start ({outcome.run.error})")
    found.judge()


@pytest.mark.req("KVCS-RECOVER-NO-INDEFINITE-WAIT", "KVCS-RECOVER-BOUND", "KVCS-VERIFY-LAYER-USABLE")
def test_stalled_production_is_given_up_within_the_budget(kvcs_consumer: object, seed: int,
                                                          tmp_path: Path) -> None:
    """The only publication stops after layer 1 and never ends its tracks. The consumer must give up (within
    its budget plus the driver's grace, else it is stopped: it waits indefinitely), within its budget (the
    recovery bound), with layers 0-1 assembled and layers 2-3 failed."""
    spec = small_spec(seed)
    stage = Stage(spec, [(HarnessPublisher(spec, stop_after=2), (0,))])
    outcome = run(kvcs_consumer, stage, tmp_path, "stalled production")
    check(not outcome.run.killed, "the consumer's end after production stalled", req="KVCS-RECOVER-NO-INDEFINITE-WAIT",
          seen=f"still waiting {outcome.run.elapsed:.1f} s into a {outcome.budget:g} s budget ({outcome.run.error})",
          expected="it gives up and reports the missing layers")
    found = Findings("stalled production: not given up within the budget with what was published")
    if outcome.budget_known:  # (a consumer told no budget that declares none is held to none)
        found.expect(outcome.run.elapsed <= outcome.budget + SLACK, "KVCS-RECOVER-BOUND",
                     f"gave up after {outcome.run.elapsed:.1f} s, its budget is {outcome.budget:g} s")
    for problem in poisoned_layers_reported_good(outcome, spec):
        found.add("KVCS-VERIFY-LAYER-USABLE", problem)
    result = outcome.require_result()
    for layer in (2, 3):
        found.expect(result.layers.get(layer) is None, "KVCS-VERIFY-LAYER-USABLE",
                     f"layer {layer} reported assembled although it was never published")
    digest_findings(found, outcome, spec, [0, 1], missing="KVCS-VERIFY-LAYER-USABLE",
                    wrong="KVCS-VERIFY-LAYER-USABLE")
    found.judge()


STALL_LAYERS = 6
# seconds per layer until the consumer asked for data (it joins after layer 0: 5 s for a spawned one under load to
# start, discover and subscribe; never more than the pause itself), and after
SLOW, FAST = 1.0, 0.05
# The pause as a fraction of the consumer's budget: well inside it (a consumer may abandon a source after
# budget/3 of silence to try another, the reference does), yet long against the fill and the layer cadence.
PAUSES = sweep.pick([0.2], [0.1, 0.28])


@pytest.mark.req("KVCS-RECOVER-WAIT-LIVE", "KVCS-RECOVER-NO-INDEFINITE-WAIT", "KVCS-LIVE-TRACK-COMPLETE",
                 "KVCS-LIVE-SUBSCRIBE", "KVCS-VERIFY-LAYER-USABLE")
@pytest.mark.parametrize("pause", PAUSES, ids=[f"pause-{p:g}-budget" for p in PAUSES])
def test_live_delivery_that_stalls_and_resumes_is_waited_for(kvcs_consumer: object, seed: int, tmp_path: Path,
                                                              pause: float) -> None:
    """The only publication is in production; the consumer joins after layer 0. After the first layer completed
    once it asked for data, live delivery pauses (a fifth of its budget): its fill ends during the pause, then
    the remaining layers and End of Track follow. Timed against the harness's own clock (the publisher's layer
    times, the relay's request times): the consumer neither gives up during the pause (every layer assembled,
    not reported failed before the publication ended) nor waits past the end (it ends soon after the last
    layer, well before its budget, without being stopped)."""
    budget = float(kvcs_consumer.budget if kvcs_consumer.budget_known else DEFAULT_BUDGET)  # type: ignore[attr-defined]
    seconds = pause * budget
    spec = small_spec(seed, layers=STALL_LAYERS)
    pub = HarnessPublisher(spec, layer_interval=FAST, slow_until_asked=min(SLOW, seconds), pause=seconds)
    stage = Stage(spec, [(pub, (0,))], live_after=1)
    outcome = run(kvcs_consumer, stage, tmp_path, f"live delivery paused {seconds:.1f} s")
    if not outcome.run.killed:  # an unreadable result fails, naming its field, before any precondition
        outcome.require_result()
    t0, done, after = pub.times.get("pause"), pub.times.get("done"), pub.paused_after
    if done is None:
        inconclusive(f"the harness publication did not complete (times {sorted(pub.times)}) [KVCS-RECOVER-WAIT-LIVE]")
    if t0 is None or after is None or after[1] >= STALL_LAYERS - 1:
        inconclusive(f"the consumer asked for no data before the last layer of the publication, so no pause fell "
                     f"inside its subscription (pause after {after}) [KVCS-RECOVER-WAIT-LIVE]")
    resumed = pub.times.get(f"layer 0/{after[1] + 1}", done)

    def at(t: float) -> str:
        return f"+{t - t0:.2f} s"

    timeline = (f"pause {seconds:.2f} s from +0 (after layer {after[1]}), resumed {at(resumed)}, publication ended "
                f"{at(done)}; consumer started {at(outcome.started)}, ended {at(outcome.ended)}, budget {budget:g} s")
    evidence.record("note", "timeline", {"timeline": timeline, "data requests": [
        f"{x.kind} {x.name.decode('ascii', 'replace')} {at(x.at)}" for x in data_requests(outcome)[0]]})
    check(not outcome.run.killed, "the consumer's end after live delivery resumed",
          req="KVCS-RECOVER-NO-INDEFINITE-WAIT", seen=f"stopped by the driver, still waiting ({timeline})",
          expected="it ends once every layer is in, or gives up within its budget")
    found = Findings(f"a live publication that paused and resumed is not received as it should be ({timeline})")
    subs, fetches = data_requests(outcome)
    asks = sorted(a.at for a in subs + fetches)
    found.expect(bool(subs), "KVCS-LIVE-SUBSCRIBE", "the consumer sent no data SUBSCRIBE for a cache in production")
    found.asserted.append("KVCS-VERIFY-LAYER-USABLE")
    for problem in poisoned_layers_reported_good(outcome, spec):
        found.add("KVCS-VERIFY-LAYER-USABLE", problem)
    result = outcome.require_result()
    missing = [layer for layer in range(STALL_LAYERS) if result.layers.get(layer) is None]
    found.asserted += ["KVCS-RECOVER-WAIT-LIVE", "KVCS-LIVE-TRACK-COMPLETE"]
    asked = f"first data request {at(asks[0])}" if asks else "no data request"
    if missing and outcome.ended < done:
        if not outcome.budget_known:  # told no budget and declaring none: nothing to hold its patience to
            inconclusive(f"layers {missing} reported failed {at(outcome.ended)}, before the publication ended, by a "
                         f"consumer with no known budget ({timeline}) [KVCS-RECOVER-WAIT-LIVE]")
        found.add("KVCS-RECOVER-WAIT-LIVE", f"layers {missing} reported failed: it gave up {at(outcome.ended)}, "
                                            f"before the publication ended and {budget - outcome.run.elapsed:.1f}"
                                            f" s before its budget ran out ({asked}; {timeline})")
    elif missing:
        found.add("KVCS-LIVE-SUBSCRIBE", f"layers {missing} reported failed although every layer was published "
                                         f"before it ended ({asked}; {timeline})")
    else:
        late = done + budget / 2
        found.expect(outcome.ended <= late and not result.gave_up, "KVCS-LIVE-TRACK-COMPLETE",
                     f"every layer assembled, but it ended {at(outcome.ended)} (later than {at(late)}, half its budget "
                     f"past the last layer){' saying it gave up' if result.gave_up else ''}: it did not see the "
                     f"tracks complete ({timeline})")
    found.judge()
