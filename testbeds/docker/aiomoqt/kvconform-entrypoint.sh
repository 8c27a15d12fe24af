#!/bin/sh
# aiomoqt 0.13.3 under the kvconform container contract (docs/docker-contract.md): the harness runs the image
# with `<role> --<name> <value> ...` and the same values in KVCONFORM_<NAME>; this maps each role aiomoqt can play
# to its tool (exec'd, so it is PID 1 and gets the harness's SIGTERM), declares every other role of the contract
# unsupported (exit 127), and runs anything else as a command (`sh -c ...`, `moq-interop-relay --help`).
set -eu
role="${1:-}"
case "$role" in
  moqt-relay|kvcs-relay)
    # aiopquic ignores --bind and listens on all interfaces; the harness only ever sends to 127.0.0.1.
    # No authorization: the policy the harness writes (KVCONFORM_POLICY) does not apply.
    exec moq-interop-relay --quic --draft 22 --bind 127.0.0.1 --port "$KVCONFORM_PORT" \
      --cert "$KVCONFORM_CERTS/cert.pem" --key "$KVCONFORM_CERTS/priv.key" ;;
  moqt-interop-client)
    # moq-interop-runner's client: one TAP point; exit 127 when it does not support the test case.
    exec moq-interop-client --relay "$KVCONFORM_RELAY" --draft 22 --tls-disable-verify --test "$KVCONFORM_TESTCASE" ;;
  moqt-publisher)
    exec moq-pub-bench "$KVCONFORM_RELAY" --draft 22 -k --pub-ns -N "$KVCONFORM_NAMESPACE" -T "$KVCONFORM_TRACK" \
      -s "${KVCONFORM_OBJECT_SIZE:-1000}" -g "${KVCONFORM_GROUP_SIZE:-5}" -r 50 -t 60 \
      --prefill "${KVCONFORM_PREFILL_GROUPS:-2}" --no-stats ;;
  tlkv-*|kbtp-*|kvcs-*|moqt-*)
    echo "kvconform-unsupported role=$role"
    exit 127 ;;
  "")
    echo "usage: <role> --<name> <value> ... (docs/docker-contract.md), or a command" >&2
    exit 2 ;;
  *)
    exec "$@" ;;
esac
