#!/bin/sh
# The KBTP suites on the VM's kernel devices (issue 13 §2), run inside the VM (cwd = the project share):
# `kvconform run kbtp` (kbtp-target and kbtp-initiator in one run: the start-up and the reports cost more than
# many checks on one TCG vCPU) against the reference on rxe0 (RoCEv2) and siw0 (iWARP) of
# testbeds/rdma-vm.yaml, reports under $KVCONFORM_VM_RUN/results/<target>. Prints
# "SUITE-RAN <target> <exit status> <seconds>" per run; the host judges the reports
# (tests/rdma_vm/test_in_vm.py). Arguments: the targets (default: rxe-ref siw-ref);
# $KVCONFORM_VM_SUITE_ARGS goes to every `kvconform run`. Each run is bounded (1200 s).
out=$KVCONFORM_VM_RUN/results
for target in ${*:-rxe-ref siw-ref}; do
  start=$(date +%s)
  # shellcheck disable=SC2086
  timeout -s KILL 1200 python3 -m kvconform run kbtp --testbed testbeds/rdma-vm.yaml --target "$target" \
    --report-dir "$out/$target" $KVCONFORM_VM_SUITE_ARGS > "$out/$target.log" 2>&1
  echo "SUITE-RAN $target $? $(( $(date +%s) - start ))"
done
