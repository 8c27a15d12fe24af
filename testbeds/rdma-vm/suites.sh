#!/bin/sh
# The KBTP suites on the VM's kernel devices (issue 13 §2), run inside the VM (cwd = the project share):
# kbtp-target and kbtp-initiator against the reference on rxe0 (RoCEv2) and siw0 (iWARP), reports under
# $KVCONFORM_VM_RUN/results/<target>-<suite>. Prints SUITE-PASS/SUITE-FAIL per run; exits 1 when one failed.
# Arguments: the targets (default: rxe-ref siw-ref). $KVCONFORM_VM_SUITE_ARGS goes to every `kvconform run`.
fail=0
out=$KVCONFORM_VM_RUN/results
targets=${*:-rxe-ref siw-ref}
for target in $targets; do
  for suite in kbtp-target kbtp-initiator; do
    dir="$out/$target-$suite"
    start=$(date +%s)
    # shellcheck disable=SC2086
    timeout -s KILL 900 python3 -m kvconform run "$suite" --testbed testbeds/rdma-vm.yaml --target "$target" \
      --report-dir "$dir" $KVCONFORM_VM_SUITE_ARGS > "$out/$target-$suite.log" 2>&1
    rc=$?
    summary=$(grep -E "^$suite: " "$out/$target-$suite.log" | tail -1)
    if [ $rc -eq 0 ]; then
      echo "SUITE-PASS $target $suite ($summary; $(( $(date +%s) - start )) s)"
    else
      tail -40 "$out/$target-$suite.log"
      echo "SUITE-FAIL $target $suite (exit $rc; $summary; $(( $(date +%s) - start )) s)"
      fail=1
    fi
  done
done
exit $fail
