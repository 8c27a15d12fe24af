#!/bin/sh
# Which in-VM device's traffic crosses lo's qdisc (docs/interop-rdma.md "Under netem"), run inside the VM after
# netem went on lo:
#   python -m kvconform.testbeds.rdma_vm.run --netem delay=20ms -- sh testbeds/rdma-vm/netem-probe.sh
# ibv_rc_pingpong over rxe0 (100 round trips) and rping over siw0 (20 pings), each timed, with lo's qdisc counters
# before and after: a device under the qdisc pays the delay on every round trip and moves the counters.
addr=$KVCONFORM_VM_SIW_ADDR
out=$KVCONFORM_VM_RUN/results
counters() { tc -s qdisc show dev lo | sed -n 's/^ *Sent \([0-9]*\) bytes \([0-9]*\) pkt.*/\2 packets/p' | head -1; }
gid=0
for f in /sys/class/infiniband/rxe0/ports/1/gids/*; do
  case $(cat "$f") in 0000:0000:0000:0000:0000:ffff:*) gid=${f##*/}; break;; esac
done
echo "PROBE rxe0 before: lo $(counters)"
start=$(date +%s%N)
timeout 60 ibv_rc_pingpong -d rxe0 -g "$gid" -n 100 > "$out/pp-server.txt" 2>&1 &
n=0
while [ $n -lt 50 ]; do
  timeout 50 ibv_rc_pingpong -d rxe0 -g "$gid" -n 100 127.0.0.1 > "$out/pp-client.txt" 2>&1 && break
  n=$((n + 1)); sleep 0.1   # bounded retry until the server listens
done
wait
echo "PROBE rxe0 after: lo $(counters), $(( ($(date +%s%N) - start) / 1000000 )) ms: $(grep 'bytes in' "$out/pp-client.txt")"
echo "PROBE siw0 before: lo $(counters)"
start=$(date +%s%N)
timeout 60 rping -s -a "$addr" -C 20 > /dev/null 2>&1 &
n=0
while [ $n -lt 50 ]; do
  timeout 50 rping -c -a "$addr" -C 20 -v > "$out/rping-client.txt" 2>&1
  [ "$(grep -c 'ping data' "$out/rping-client.txt")" -ge 20 ] && break
  n=$((n + 1)); sleep 0.1   # bounded retry until the server listens
done
wait
echo "PROBE siw0 after: lo $(counters), $(( ($(date +%s%N) - start) / 1000000 )) ms: $(grep -c 'ping data' "$out/rping-client.txt") pings"
