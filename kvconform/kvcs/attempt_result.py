"""The record of one attempt of the reference KVCS consumer (one publication through one relay), and how an
attempt gives up on its publication. Plain data: the consumer's core (``consumer_core``, ``attempt``) and its
asyncio adapter share it."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvconform.kvcs.consume_result import LayerReady
from kvconform.kvcs.manifest import Manifest

__all__ = ["Abandon", "AttemptResult"]


class Abandon(Exception):
    """The attempt's publication is unusable (bad manifest, no manifest, nothing to use)."""


@dataclass
class AttemptResult:
    """What one attempt found: its publication and manifest, the segments it used, the layers it verified and
    why the others failed, how it ended ("complete", "abandoned: ...", "stalled ...") and in which mode."""

    relay: str
    pub: bytes
    manifest: Manifest | None
    plan: tuple[tuple[int, int], ...]  # (segment, blocks used)
    layers: dict[int, LayerReady] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)
    outcome: str = "ok"
    mode: str | None = None
    retryable: set[int] = field(default_factory=set)  # layers lost as missing (not as rejected)
