"""KBTP — KV Cache Block Transfer Protocol over RDMA (spec/seeds/003_a48f4321884951de.txt, spec/rdma-bindings.md).

`constants` (registries), `messages` (wire codec), `layers` (scapy), `ring` (free-block ring arithmetic),
`vectors` (test vector generators and checkers). Requirement ids: conformance/requirements/kbtp.yaml.
"""
