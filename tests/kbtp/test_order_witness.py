"""targets/kbtp_order.py on a stand-in fabric: what it holds, when it lets go, and what it can and cannot tell."""

from __future__ import annotations

from kvconform.rdma.wire.impair import Impairment
from kvconform.targets.kbtp_order import OrderWitness, install


class _Fabric:
    """The things the witness reads of a wire fabric: its binding, its step count and its time."""

    binding = "roce"
    now = 0.0
    owns_races = False
    impairer = None

    def __init__(self) -> None:
        self.steps = 0

    def process(self, data: bytes) -> None:  # what delivering a request does: one traced engine step
        self.steps += 1


def test_answers_are_held_in_order_and_a_request_inside_the_hold_is_told() -> None:
    fabric = _Fabric()
    w = OrderWitness(fabric, "t", hold_s=0.03)
    sent: list[bytes] = []
    w.datagram("t<", b"read-1", fabric.process, now=0.0)  # request 1 enters, processed at step 1
    w.datagram("t>", b"answer-1", sent.append, now=0.0)  # its answer, produced at step 1, held
    w.datagram("t<", b"read-2", fabric.process, now=0.01)  # request 2 enters while answer 1 is held: step 2
    w.poll(0.02)
    assert sent == [], "released before its hold"
    w.poll(0.031)
    assert sent == [b"answer-1"]
    w.datagram("t>", b"answer-2", sent.append, now=0.031)  # (its answer, produced at step 2)
    w.datagram("t<", b"read-3", fabric.process, now=0.07)  # request 3 after answer 1 left: step 3
    assert w.answered_before(1, 2) is False  # read 2 was issued before read 1 completed
    assert w.answered_before(1, 3) is True
    assert w.answered_before(2, 4) is None  # never seen entering: not observable, never a pass
    w.poll(1.0)
    assert sent == [b"answer-1", b"answer-2"]
    assert w.counts["order-hold"] == 2


def test_a_request_delayed_by_the_runs_impairment_entered_when_it_arrived() -> None:
    fabric = _Fabric()
    w = OrderWitness(fabric, "t", hold_s=0.03)
    w.spec = Impairment(delay=0.05)  # the run's own impairment delays what comes in
    sent: list[bytes] = []
    w.datagram("t>", b"answer-0", sent.append, now=0.0)  # produced at step 0
    w.datagram("t<", b"read-1", fabric.process, now=0.01)  # arrives inside the hold, processed only at 0.06
    w.poll(0.031)
    w.poll(0.07)
    assert sent == [b"answer-0"] and fabric.steps == 1
    assert w.answered_before(0, 1) is False


def test_no_witness_where_the_harness_does_not_own_the_send_path() -> None:
    class Emulated(_Fabric):
        owns_races = True

    class Device(_Fabric):
        crafts_frames = False

    assert install(Emulated(), "t") is None
    assert install(Device(), "t") is None
    fabric = _Fabric()
    assert isinstance(install(fabric, "t"), OrderWitness) and isinstance(fabric.impairer, OrderWitness)


class _Memory:
    """What an engine's memory does with a note: records it (the fabric's trace)."""

    def __init__(self) -> None:
        self.notes: list[tuple[str, int]] = []

    def note(self, what: str, **args: int) -> None:
        self.notes.append((what, args.get("stag", 0)))

    def resolve(self) -> str:
        return "resolved"


class _Conn:
    def __init__(self) -> None:
        self.engine = type("Engine", (), {})()
        self.engine.memory = _Memory()


def test_a_held_initiators_read_response_and_what_happened_before_it_left() -> None:
    """On a harness initiator's connection: the target's Read Request of the watched buffer is stamped when it
    arrives, the answer the initiator produces is held, and `left_after` tells when it left; the check's own
    observations (stamps) fall before or after in the one sequence."""
    fabric = _Fabric()
    w = OrderWitness(fabric, "W", hold_s=0.03)
    conn = _Conn()
    memory = conn.engine.memory
    arrived = w.watch_reads(conn, stag=0x42)
    assert arrived == [] and conn.engine.memory.resolve() == "resolved"  # everything else is the engine's memory
    sent: list[bytes] = []
    start = w.stamp()
    conn.engine.memory.note("rdma_read-arrive", stag=0x7)  # another buffer: not stamped
    conn.engine.memory.note("rdma_read-arrive", stag=0x42)
    assert len(arrived) == 1 and arrived[0].seq > start.seq
    assert memory.notes == [("rdma_read-arrive", 0x7), ("rdma_read-arrive", 0x42)]  # still noted for the trace
    assert w.left_after(arrived[0]) is None  # nothing held since
    w.datagram("W>", b"read-response", sent.append, now=0.0)
    inside = w.stamp()  # e.g. an entry read answered while the response is held
    w.poll(0.02)
    assert w.left_after(arrived[0]) is None and sent == []  # still held
    fabric.now = 0.031
    w.poll(0.031)
    left = w.left_after(arrived[0])
    assert sent == [b"read-response"] and left is not None and left.t == 0.031
    assert arrived[0].seq < inside.seq < left.seq < w.stamp().seq
    assert w.left_after(left) is None


def test_no_read_watch_without_an_engine_the_harness_runs() -> None:
    w = OrderWitness(_Fabric(), "W")
    assert w.watch_reads(object(), stag=1) is None


def test_an_answer_sent_from_a_later_step_of_its_round_is_judged_by_what_left() -> None:
    """A round of arrivals processed, then flushed once: the answer to the read of step 1 leaves from step 2 (an ACK
    that came after the read). The next read entering after it left was issued after the read completed; one
    entering while it is held was not."""
    fabric = _Fabric()
    w = OrderWitness(fabric, "t", hold_s=0.03)
    sent: list[bytes] = []
    w.datagram("t<", b"read-1", fabric.process, now=0.0)  # step 1
    w.datagram("t<", b"ack", fabric.process, now=0.0)  # step 2, same round
    w.datagram("t>", b"answer-1", sent.append, now=0.0)  # flushed after the round: produced at step 2
    w.datagram("t<", b"read-2", fabric.process, now=0.01)  # step 3: inside the hold
    w.poll(0.031)
    w.datagram("t<", b"read-3", fabric.process, now=0.04)  # step 4: after answer 1 left
    assert w.answered_before(1, 3) is False
    assert w.answered_before(1, 4) is True
