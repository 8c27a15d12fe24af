"""The Linux RDMA testbed VM (issue 13 §1): a recipe that builds it from Debian packages, a driver that runs it.

See /work/shared/spec/rdma-vm-testbed.md for the measured facts this follows: Debian bookworm's stock kernel
with ``rdma_rxe`` and an out-of-tree ``siw.ko``, TCG, one vCPU, the uncompressed ``vmlinux`` (PVH) boot and a
root filesystem shared read-only over virtio-9p.
"""
