"""The reference over a wire fabric that is blind where a verbs device is (kvconform.rdma.verbs.fabric): it does not
see the one-sided operations done on its memory, nor can it craft a frame. The checks that need either must end
inconclusive on it, saying why, never pass (tests/rdma/test_blind_verdicts.py). Targets for `kvconform run`:
``python:tests.rdma.blind:BlindTarget`` and ``python:tests.rdma.blind:BlindInitiator``."""

from __future__ import annotations

from typing import Any

from kvconform.rdma.wire.fabric import WireFabric
from kvconform.targets.kbtp import ReferenceInitiatorDriver, ReferenceTargetDriver, TargetParams
from kvconform.targets.kbtp_wire import wire_of


class BlindWireFabric(WireFabric):
    observes_remote_ops = False
    crafts_frames = False

    def __repr__(self) -> str:
        return f"blind {self.binding} fabric"


def _blind(params: TargetParams, trace: bool) -> BlindWireFabric:
    return BlindWireFabric(params.profile, binding=wire_of(params.profile), trace=trace)  # type: ignore[arg-type]


class BlindTarget(ReferenceTargetDriver):
    def make_fabric(self, params: TargetParams, *, trace: bool = False) -> Any:
        return _blind(params, trace)


class BlindInitiator(ReferenceInitiatorDriver):
    def make_fabric(self, params: TargetParams, *, trace: bool = False) -> Any:
        return _blind(params, trace)
