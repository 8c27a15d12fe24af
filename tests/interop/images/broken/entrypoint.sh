#!/bin/sh
# A deliberately broken contract image (tests/interop/test_docker_contract.py): BROKEN (set by the testbed
# entry, tests/interop/contract-broken.yaml) chooses how it breaks the contract, whatever role it is asked for.
role="${1:-}"
case "${BROKEN:-}" in
  unsupported)        # a declaration, not a failure: every role is "not played"
    echo "kvconform-unsupported role=$role"
    exit 127 ;;
  exit127)            # exits 127 without the declaration: what a shell's "command not found" looks like
    echo "sh: 1: vendor-kv-tool: not found" >&2
    exit 127 ;;
  exit3)              # gives up at once
    echo "broken: exiting 3 as $role" >&2
    exit 3 ;;
  hang)               # never gets ready, never finishes, and ignores SIGTERM
    trap '' TERM
    echo "broken: hanging as $role"
    while :; do sleep 1; done ;;
  ready-ignore-term)  # says it is ready, then serves nothing and ignores SIGTERM
    trap '' TERM
    echo "kvconform-ready port=${KVCONFORM_PORT:-}"
    while :; do sleep 1; done ;;
  *)
    echo "broken: unknown BROKEN=${BROKEN:-}" >&2
    exit 2 ;;
esac
