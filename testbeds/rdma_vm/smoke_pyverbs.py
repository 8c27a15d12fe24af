"""Inside the VM: open rxe0 and siw0 with pyverbs and print their device and port attributes (the .ci/rdma smoke).

Exits non-zero when a device is missing or its port is not ACTIVE (rdma-bindings.md §6: the verbs API as
rdma-core's own tests use it).
"""

from __future__ import annotations

import sys

PORT_ACTIVE = 4  # ibv_port_state IBV_PORT_ACTIVE


def main() -> int:
    from pyverbs.device import Context, get_device_list  # type: ignore[import-not-found, unused-ignore]  # optional: pyverbs ships with rdma-core, on RDMA hosts only  # VM only

    names = sorted(d.name.decode() for d in get_device_list())
    print(f"pyverbs devices: {names}")
    bad = 0
    for name in ("rxe0", "siw0"):
        if name not in names:
            print(f"pyverbs: {name} missing")
            bad += 1
            continue
        with Context(name=name) as ctx:
            dev = ctx.query_device()
            port = ctx.query_port(1)
            print(f"pyverbs {name}: fw={dev.fw_version or '-'} max_qp={dev.max_qp} "
                  f"max_mr_size={dev.max_mr_size} max_qp_wr={dev.max_qp_wr} port1.state={port.state} "
                  f"active_mtu={port.active_mtu} gid_tbl_len={port.gid_tbl_len}")
            bad += port.state != PORT_ACTIVE
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
