"""Harness-wide test setup.

pytester's in-process runs (``pytester.runpytest``) remove, when they end, every module they imported. The
kvconform plugin imports its lanes (numpy, grpc, aioquic, ...) only in a session that uses it, so the first
inner run would import them and the next one import them again, which C extensions such as numpy refuse
("cannot load module more than once per process"). Importing the lanes once here keeps them in every run.
"""

from __future__ import annotations

import importlib

from kvconform.fixtures.plugin import PROTOCOL_FIXTURE_MODULES

for _name in PROTOCOL_FIXTURE_MODULES:
    importlib.import_module(_name)
