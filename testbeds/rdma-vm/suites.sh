#!/bin/sh
# The KBTP suites on the VM's kernel devices (issue 13 §2), run inside the VM (cwd = the project share):
# kbtp-target and kbtp-initiator against the reference on rxe0 (RoCEv2) and siw0 (iWARP) of
# testbeds/rdma-vm.yaml, reports under $KVCONFORM_VM_RUN/results/<target>-<suite>. Prints
# "SUITE-RAN <target> <suite> <exit status> <seconds>" per run; the host judges the reports
# (tests/rdma_vm/test_in_vm.py). Arguments: the targets (default: rxe-ref siw-ref);
# $KVCONFORM_VM_SUITE_ARGS goes to every `kvconform run`. Each run is bounded (900 s).
out=$KVCONFORM_VM_RUN/results
for target in ${*:-rxe-ref siw-ref}; do
  for suite in kbtp-target kbtp-initiator; do
    start=$(date +%s)
    # shellcheck disable=SC2086
    timeout -s KILL 900 python3 -m kvconform run "$suite" --testbed testbeds/rdma-vm.yaml --target "$target" \
      --report-dir "$out/$target-$suite" $KVCONFORM_VM_SUITE_ARGS > "$out/$target-$suite.log" 2>&1
    echo "SUITE-RAN $target $suite $? $(( $(date +%s) - start ))"
  done
done
