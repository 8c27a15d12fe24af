"""InfiniBand RC over RoCEv2 as a sans-I/O engine (rdma-bindings §4, §5.1, §5.4)."""

from kvconform.rdma.roce.engine import RoceEngine
from kvconform.rdma.roce.qp import QpInfo

__all__ = ["QpInfo", "RoceEngine"]
