#!/bin/sh
# Sourced inside the VM by the host<->VM interop runs (testbeds/rdma_vm/vm.py Links): brings up the NICs qemu
# gave the VM, found by MAC, and puts a kernel RDMA device on each:
#   52:54:00:4b:00:02  the RoCEv2 segment (frames to the host over qemu's socket netdev): 10.78.0.2/24, rxe1
#   52:54:00:4b:00:03  qemu's user-mode network (TCP forwarded from the host's 127.0.0.1): 10.0.2.15/24, siw1
# The host's end of the segment is 10.78.0.1 (the userspace RoCEv2 binding's link); on the user-mode network the
# host's loopback is 10.0.2.2. None of these addresses exists outside the VM and the host process's frames.
modprobe virtio_net  # no udev in the VM: nothing loads the NICs' driver by itself
nic() {
  for d in /sys/class/net/*; do
    if [ "$(cat "$d/address")" = "$1" ]; then echo "${d##*/}"; return 0; fi
  done
  return 1
}
if roce_if=$(nic 52:54:00:4b:00:02); then
  ip link set "$roce_if" up && ip addr add 10.78.0.2/24 dev "$roce_if" && rdma link add rxe1 type rxe netdev "$roce_if"
fi
if tcp_if=$(nic 52:54:00:4b:00:03); then
  ip link set "$tcp_if" up && ip addr add 10.0.2.15/24 dev "$tcp_if" && ip route add default via 10.0.2.2 \
    && rdma link add siw1 type siw netdev "$tcp_if"
fi
echo "LINKS roce=${roce_if:-none} tcp=${tcp_if:-none}"
