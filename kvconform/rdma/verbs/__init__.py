"""The verbs binding: the fabric interface on a kernel RDMA device through pyverbs (rdma-bindings §6, §8 item 9).

`device` discovers devices and what they can do (never raising), `cm` is rdma_cm over librdmacm for iWARP,
`engine` is one QP behind the wire fabric's engine contract, `fabric` is `VerbsFabric`. Importing this
package needs nothing; building a fabric needs pyverbs and a device (rdma-core; Debian python3-pyverbs).
"""
