"""Correct KBTP targets that make choices the text leaves open, as ``python:`` targets for the harness's tests.

``OffersUndeclaredFeatures``: the reference offering every optional feature the binding allows, whatever PICS
declares. A test bed's defaults claim no optional feature; that is no claim the target lacks one, so the suites
must neither exercise the features nor fail the target for offering them, until PICS declares its features.
"""

from __future__ import annotations

from kvconform.kbtp.constants import Features
from kvconform.rdma import Fabric, Node
from kvconform.targets.kbtp import ReferenceTargetDriver, TargetEndpoint, TargetParams

EVERY_FEATURE = Features.DIRECT_LOAD | Features.DIRECT_ALLOC | Features.RECORD_COMPLETION | Features.ADDR_LE


class OffersUndeclaredFeatures(ReferenceTargetDriver):
    """The reference target with every feature on offer (RECORD_COMPLETION only where the binding allows it)."""

    def start(self, fabric: Fabric, node: Node, params: TargetParams) -> TargetEndpoint:
        return super().start(fabric, node, params.with_(features=EVERY_FEATURE))
