#!/bin/sh
# The KBTP suites on the VM's kernel devices (issue 13 §2), run inside the VM (cwd = the project share):
# `kvconform run kbtp` (kbtp-target and kbtp-initiator in one run: the start-up and the reports cost more than
# many checks on one TCG vCPU) against the reference on rxe0 (RoCEv2) and siw0 (iWARP) of
# testbeds/rdma-vm.yaml, reports under $KVCONFORM_VM_RUN/results/<target>. Prints
# "SUITE-RAN <target> <exit status> <seconds>" per run; the host judges the reports
# (tests/rdma_vm/test_in_vm.py). Arguments: the targets (default: rxe-ref siw-ref);
# $KVCONFORM_VM_SUITE_ARGS goes to every `kvconform run` ($KVCONFORM_VM_SUITE_K: its -k expression). Each run is bounded (1200 s). With $KVCONFORM_VM_NETEM
# (testbeds/rdma-vm/netem.sh) the runs go through netem on lo: siw0's TCP streams cross lo's qdisc; rxe0 loops
# its packets back inside rdma_rxe (the counters before and after each run, netem-stats.txt, show which).
out=$KVCONFORM_VM_RUN/results
. testbeds/rdma-vm/netem.sh
netem_apply lo || exit 1
for target in ${*:-rxe-ref siw-ref}; do
  start=$(date +%s)
  netem_stats "before $target"
  # shellcheck disable=SC2086
  timeout -s KILL 1200 python3 -m kvconform run kbtp --testbed testbeds/rdma-vm.yaml --target "$target" \
    --report-dir "$out/$target" $KVCONFORM_VM_SUITE_ARGS ${KVCONFORM_VM_SUITE_K:+-k "$KVCONFORM_VM_SUITE_K"} \
    > "$out/$target.log" 2>&1
  code=$?
  netem_stats "after $target"
  echo "SUITE-RAN $target $code $(( $(date +%s) - start ))"
done
