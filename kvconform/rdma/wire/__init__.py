"""Wire bindings of the fabric interface: real RDMA wire formats over real sockets (rdma-bindings.md §3-§5).

`engine` is the sans-I/O contract each binding's protocol engine implements (bytes in, bytes and
completions out); `kvconform.rdma.iwarp` (MPA/DDP/RDMAP over TCP) and `kvconform.rdma.roce` (IB RC
over RoCEv2/UDP) are the engines; `fabric` runs KBTP actors in real time over them.
"""
