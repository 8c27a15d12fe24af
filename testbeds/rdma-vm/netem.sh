#!/bin/sh
# Sourced inside the VM (suites.sh, interop-serve.sh): `tc netem` on the interfaces a run's traffic crosses when
# $KVCONFORM_VM_NETEM holds netem's arguments (testbeds/rdma_vm/netem.py builds them; issue 23 item 5, the VM
# half). netem_apply DEV... puts a root netem qdisc on each and exports KVCONFORM_NETEM (a run's coverage.json
# records it in its meta); netem_stats LABEL appends the qdiscs' counters (sent, dropped, duplicated packets) to
# $KVCONFORM_VM_RUN/results/netem-stats.txt: the evidence of what the link did; netem_watch N rewrites
# netem-now.txt with them every N seconds in the background (a VM the host stops has no "after").
# Without the variable they do nothing.
netem_devs=""
netem_apply() {
  [ -n "$KVCONFORM_VM_NETEM" ] || return 0
  modprobe sch_netem || { echo "NETEM-FAIL modprobe sch_netem"; return 1; }
  for dev in "$@"; do
    [ -n "$dev" ] || continue
    # shellcheck disable=SC2086
    tc qdisc replace dev "$dev" root netem $KVCONFORM_VM_NETEM || { echo "NETEM-FAIL $dev"; return 1; }
    netem_devs="$netem_devs $dev"
    echo "NETEM dev=$dev $(tc qdisc show dev "$dev" | head -1)"
  done
  KVCONFORM_NETEM="tc netem $KVCONFORM_VM_NETEM on${netem_devs} in the VM (unseeded: the kernel's generator)"
  export KVCONFORM_NETEM
  echo "$KVCONFORM_NETEM" > "$KVCONFORM_VM_RUN/results/netem.txt"
}
netem_stats() {
  [ -n "$netem_devs" ] || return 0
  for dev in $netem_devs; do
    echo "== $1 $dev $(date +%s)"
    tc -s qdisc show dev "$dev"
  done >> "$KVCONFORM_VM_RUN/results/netem-stats.txt"
}
netem_watch() {
  [ -n "$netem_devs" ] || return 0
  (while :; do
    for dev in $netem_devs; do echo "== $dev $(date +%s)"; tc -s qdisc show dev "$dev"; done \
      > "$KVCONFORM_VM_RUN/results/netem-now.tmp"
    mv "$KVCONFORM_VM_RUN/results/netem-now.tmp" "$KVCONFORM_VM_RUN/results/netem-now.txt"
    sleep "$1"  # a sampling period, not a wait for anything
  done) &
}
