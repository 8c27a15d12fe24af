"""The harness's own tests (not packaged): importable as ``tests``, so each file has one module name."""
