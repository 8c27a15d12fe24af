"""kvconform: conformance and interop harness for KV-cache transport protocols (TLKV, KBTP, KVCS)."""

__version__ = "0.1.0"
