"""KBTP suites: kbtp-target (the harness plays initiators) and kbtp-initiator (the harness plays the target)."""
