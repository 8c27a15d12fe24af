"""The sans-I/O cores of the reference KVCS publisher and consumer (issue 24 item 1): they import neither asyncio
nor time (nor the asyncio MOQT client), and they run on a fake ``now``: commands and deadlines out, nothing read
from a clock. The publisher core's commands feed the consumer core directly, with no transport in between."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvconform.kvcs import attempt, attempt_result, consume_result, consumer_core, publisher_core, track_state
from kvconform.kvcs.attempt import Attempt
from kvconform.kvcs.attempt_result import Abandon, AttemptResult
from kvconform.kvcs.consume_result import ConsumerIdentity, ConsumerOptions, LayerReady, convention_layer_digest
from kvconform.kvcs.consumer_core import ConsumerCore
from kvconform.kvcs.content import example_spec
from kvconform.kvcs.publisher_core import (
    FETCH_SLOT_TIMEOUT,
    EndTrack,
    Pause,
    PublisherCore,
    PublishObject,
    SegmentAdded,
)
from kvconform.kvcs.track_state import Delivery
from kvconform.moqt.client import ReceivedObject
from kvconform.moqt.data import ObjectStatus
from kvconform.moqt.messages import PublishDone
from kvconform.moqt.structures import Location

CORES = (publisher_core, consumer_core, attempt, attempt_result, track_state, consume_result)
FORBIDDEN = ("asyncio", "time", "kvconform.moqt.client", "kvconform.moqt.quic", "threading", "socket")


def _imports(tree: ast.Module) -> list[str]:
    """Every module a file imports, except under ``if TYPE_CHECKING:`` (annotations only)."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


@pytest.mark.parametrize("module", CORES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_a_core_imports_neither_asyncio_nor_time(module: object) -> None:
    path = Path(getattr(module, "__file__", ""))
    source = path.read_text("utf-8")
    found = [n for n in _imports(ast.parse(source)) if any(n == f or n.startswith(f + ".") for f in FORBIDDEN)]
    assert not found, f"{path.name} imports {found}"
    assert "monotonic(" not in source and "loop.time(" not in source and "get_running_loop" not in source


# ---- the publisher core on a fake now ----------------------------------------------------------------------


def test_a_fetch_slot_is_held_until_exactly_its_deadline() -> None:
    core = PublisherCore(example_spec(layers=2, blocks=1), fetch_limit=2)
    assert core.admit_fetch("a", 10.0) == 10.0 + FETCH_SLOT_TIMEOUT
    assert core.admit_fetch("b", 11.0) == 11.0 + FETCH_SLOT_TIMEOUT
    assert core.admit_fetch("c", 12.0) is None, "a third FETCH while two are in progress is refused"
    assert core.next_deadline() == 10.0 + FETCH_SLOT_TIMEOUT
    core.on_timer(10.0 + FETCH_SLOT_TIMEOUT - 1e-9)
    assert core.fetches_active == 2, "a slot is still held just before its deadline"
    core.on_timer(10.0 + FETCH_SLOT_TIMEOUT)
    assert core.fetches_active == 1 and core.next_deadline() == 11.0 + FETCH_SLOT_TIMEOUT
    assert core.admit_fetch("c", 10.0 + FETCH_SLOT_TIMEOUT) is not None
    core.release_fetch("b")
    core.release_fetch("b")  # a FETCH released twice (sent, then its timer) counts once
    assert core.fetches_active == 1


def test_the_publication_is_commands_and_steps_without_io() -> None:
    spec = example_spec(layers=3, blocks=2)
    core = PublisherCore(spec, layer_interval=0.25)
    steps = list(core.publication())
    assert [type(s) for s in steps] == [SegmentAdded, Pause, Pause, Pause]
    assert all(s.seconds == 0.25 for s in steps if isinstance(s, Pause))
    names = [c.track for c in core.outbox]
    assert names[0] == b"manifest" and names[-1] == b"manifest", "manifest first, and once the segment completes"
    k = [c for c in core.outbox if isinstance(c, PublishObject) and c.track == b"k.raw.s0"]
    assert [(c.group, c.object_id) for c in k] == [(g, o) for g in range(3) for o in range(3)]
    assert [c.status for c in k if c.object_id == 2] == [ObjectStatus.END_OF_GROUP] * 3
    assert [c.track for c in core.outbox if isinstance(c, EndTrack)] == [b"k.raw.s0", b"v.raw.s0"]


# ---- the consumer core on a fake now, fed by the publisher core ---------------------------------------------


def _deliver(core: PublisherCore, track: bytes) -> list[ReceivedObject]:
    """What a subscriber of ``track`` gets: each Group on its own stream, End of Track on one of its own."""
    out: list[ReceivedObject] = []
    for c in core.outbox:
        if c.track != track:
            continue
        if isinstance(c, EndTrack):
            last = max(o.location.group for o in out)
            out.append(ReceivedObject("subgroup", 1000, Location(last + 1, 0), status=ObjectStatus.END_OF_TRACK))
        else:
            out.append(ReceivedObject("subgroup", 2 + 4 * c.group, Location(c.group, c.object_id), c.payload,
                                      c.status))
    return out


def _attempt(spec_layers: int = 3, budget: float = 30.0, stall: float = 5.0) -> tuple[Attempt, ConsumerCore,
                                                                                        PublisherCore]:
    spec = example_spec(layers=spec_layers, blocks=2)
    pub = PublisherCore(spec)
    consumer = ConsumerCore(ConsumerIdentity.from_spec(spec),
                            ConsumerOptions(relays=("moqt://relay",), budget=budget, stall_timeout=stall))
    consumer.start(100.0)
    result = AttemptResult("moqt://relay", pub.namespace.pub_id, None, ())
    consumer.attempts.append(result)
    run = Attempt(consumer, "moqt://relay", pub.namespace, result)
    run.manifest_track = pub.manifest_track  # unsigned: the adapter falls back to "manifest" when there is no .cose
    return run, consumer, pub


def test_the_budget_runs_out_exactly_at_its_deadline() -> None:
    run, consumer, _ = _attempt(budget=30.0, stall=5.0)
    assert consumer.remaining(129.5) == pytest.approx(0.5) and consumer.remaining(130.0) == 0.0
    run.manifest_delivery = Delivery(False)
    assert run.manifest_step(100.0) == 105.0, "the wait ends at the stall bound"
    assert run.manifest_step(127.0) == 130.0, "or at the end of the budget when that is sooner"
    with pytest.raises(Abandon, match="no manifest version arrived"):
        run.manifest_step(130.0)


def test_a_publication_assembled_by_the_cores_alone() -> None:
    run, consumer, pub = _attempt(spec_layers=3)
    ready: list[LayerReady] = []
    consumer.on_ready = ready.append
    list(pub.publication())
    run.manifest_delivery = Delivery(False, _deliver(pub, b"manifest"))
    assert run.manifest_step(100.0) is None and run.manifest is not None
    assert run.prepare() == "fetch", "every segment is complete: retrieval of a completed cache"
    for ts in run.tracks:
        ts.delivery = Delivery(False, _deliver(pub, ts.needed.track.name), subgroup_streams={1000: "fin"})
        ts.delivery.done = PublishDone(0, 0, b"")
    assert run.step(101.0) is None and run.result.outcome == "complete"
    assert [r.layer for r in ready] == [0, 1, 2]
    assert all(r.digest == convention_layer_digest(pub.spec, r.layer, [(0, 2)]) for r in ready)


def test_an_attempt_without_progress_stalls_at_its_deadline() -> None:
    run, _, pub = _attempt(spec_layers=3, stall=2.0)
    list(pub.publication())
    run.manifest_delivery = Delivery(False, _deliver(pub, b"manifest")[:1])  # the first version only: live
    assert run.manifest_step(100.0) is None
    assert run.prepare() == "live"
    for ts in run.tracks:
        ts.delivery = Delivery(False, [o for o in _deliver(pub, ts.needed.track.name) if o.location.group == 0],
                               subgroup_streams={2: "open"})
    assert run.step(100.0) == 102.0
    run.stalled()
    assert run.result.outcome == "stalled (2.0 s without progress)"
    assert set(run.result.layers) == {0} and run.result.reasons[1] == "nothing arrived for 2.0 s (stalled)"
