"""Userspace iWARP: MPA (RFC 5044 / RFC 6581) framing, DDP (RFC 5041) segments, RDMAP (RFC 5040, RFC 7306)
messages, and `IwarpEngine`, a sans-I/O RDMAP stream endpoint (rdma-bindings.md §1-§3)."""
