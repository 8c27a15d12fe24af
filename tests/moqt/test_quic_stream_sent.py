"""``MoqtProtocol._stream_sent`` (what ``when_sent`` waits on) reads aioquic's pending ranges by length: a
RangeSet has no truth value (its ``__bool__`` raises), so a stream with its FIN written and data still pending,
e.g. held back by the peer's flow control, must read as not sent instead of raising."""

from __future__ import annotations

from types import SimpleNamespace

from aioquic.quic.rangeset import RangeSet

from kvconform.moqt.quic import MoqtProtocol


def _protocol(pending: RangeSet, eof: bool) -> object:
    sender = SimpleNamespace(_reset_error_code=None, _buffer_fin=100, _pending=pending, _pending_eof=eof)
    return SimpleNamespace(_quic=SimpleNamespace(_streams={2: SimpleNamespace(sender=sender)}))


def test_a_stream_with_pending_data_is_not_sent() -> None:
    assert MoqtProtocol._stream_sent(_protocol(RangeSet([range(40, 100)]), True), 2) is False  # type: ignore[arg-type]


def test_a_stream_with_everything_and_its_fin_sent_is_sent() -> None:
    assert MoqtProtocol._stream_sent(_protocol(RangeSet(), False), 2) is True  # type: ignore[arg-type]
    assert MoqtProtocol._stream_sent(_protocol(RangeSet(), True), 2) is False  # type: ignore[arg-type]
