"""kbtp-initiator: checks of a KBTP initiator facing the harness's observing target."""
