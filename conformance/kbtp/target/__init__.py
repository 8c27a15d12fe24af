"""kbtp-target: checks of a KBTP target (block pool owner) driven by harness initiators on an emulated fabric."""
