"""The runtime the in-process fabrics hold (has-a): node memory, CQs, posting checks, actors and steps.

The emulated, wire and verbs fabrics each hold one `Runtime` through `RuntimeFabric`; their endpoints check
what is posted through `PostingEndpoint` and complete through `kvconform.rdma.completion`. The wire and verbs
fabrics run its steps in real time through a `RealTimeLoop` each holds (the emulated one through its scheduler).
"""

from kvconform.rdma.runtime.actor import Actor
from kvconform.rdma.runtime.core import Runtime
from kvconform.rdma.runtime.cq import EmuCQ
from kvconform.rdma.runtime.fabric import RuntimeFabric
from kvconform.rdma.runtime.memory import EmuBuffer, EmuNode
from kvconform.rdma.runtime.realtime import RealTimeIo, RealTimeLoop
from kvconform.rdma.runtime.requests import PostingEndpoint, gather

__all__ = [
    "Actor", "EmuBuffer", "EmuCQ", "EmuNode", "PostingEndpoint", "RealTimeIo", "RealTimeLoop", "Runtime",
    "RuntimeFabric", "gather",
]
