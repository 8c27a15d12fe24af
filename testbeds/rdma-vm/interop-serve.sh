#!/bin/sh
# Host<->VM interop, the VM's side when the VM serves (run inside the VM by tests/rdma_vm/test_interop.py):
# the reference KBTP target on rxe1 (the RoCEv2 segment to the host; its out-of-band exchange on
# 10.0.2.15:18515, forwarded from the host) and on siw1 (rdma_cm on 10.0.2.15:7471, forwarded); and the cmd:
# bridge's agent on 10.0.2.15:18516 (forwarded), which forks the reference initiator on rxe1 (kbtp+roce) or
# siw1 (kbtp+iwarp) per connection (testbeds/rdma_vm/bridge_agent.py). Prints INTEROP-SERVING once all three
# listen, then serves until the host stops the VM (bounded by $1 seconds, default 1800). Each server's output is in
# $KVCONFORM_VM_RUN/results/serve-<device>.log (the agent's and its initiators': serve-bridge.log).
out=$KVCONFORM_VM_RUN/results
. testbeds/rdma-vm/links.sh
# $KVCONFORM_VM_NETEM: netem on both NICs facing the host; it impairs what the VM sends (testbeds/rdma-vm/netem.sh)
. testbeds/rdma-vm/netem.sh
netem_apply "$roce_if" "$tcp_if" || exit 1
netem_watch 5
python3 -m kvconform serve kbtp-target --binding verbs --device rxe1 --host 10.0.2.15 --port 18515 \
  --features DIRECT_LOAD,DIRECT_ALLOC,RECORD_COMPLETION,ADDR_LE > "$out/serve-rxe1.log" 2>&1 &
rxe=$!
python3 -m kvconform serve kbtp-target --binding verbs --device siw1 --host 10.0.2.15 --port 7471 \
  --features DIRECT_LOAD,ADDR_LE > "$out/serve-siw1.log" 2>&1 &
siw=$!
python3 -m kvconform.testbeds.rdma_vm.bridge_agent --host 10.0.2.15 --port 18516 --device roce=rxe1 \
  --device iwarp=siw1 > "$out/serve-bridge.log" 2>&1 &
bridge=$!
i=0
until grep -q "^listening on" "$out/serve-rxe1.log" && grep -q "^listening on" "$out/serve-siw1.log" \
    && grep -q "^listening on" "$out/serve-bridge.log"; do
  i=$((i + 1))
  if [ $i -gt 1200 ]; then echo "INTEROP-FAIL the servers did not listen within 240 s"; cat "$out"/serve-*.log; exit 1; fi
  sleep 0.2
done
echo "INTEROP-SERVING rxe1=10.0.2.15:18515 siw1=10.0.2.15:7471 bridge=10.0.2.15:18516"
(sleep "${1:-1800}"; kill $rxe $siw $bridge) 2>/dev/null &
wait $rxe $siw $bridge
