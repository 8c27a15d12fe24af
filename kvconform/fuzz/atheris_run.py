"""The atheris child: ``python -m kvconform.fuzz.atheris_run <parser> [libFuzzer options] [corpus dirs]``.

The parser modules are imported inside ``atheris.instrument_imports`` so libFuzzer sees their coverage;
the target's accepted errors are swallowed, anything else propagates and libFuzzer saves the input as a
``crash-*`` artifact.  Hangs (``-timeout``) and memory (``-rss_limit_mb``, ``-malloc_limit_mb``) are
libFuzzer's own bounds.  ``kvconform.fuzz.atheris_engine`` starts this and reads what it leaves.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence

from kvconform.fuzz.registry import all_targets, resolve

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    import atheris  # optional: kvconform[fuzz]

    with atheris.instrument_imports(include=["kvconform"]):
        all_targets()  # every parser module (and the toys, when asked for) loads instrumented here
        target = resolve(args[0])
    accepts = target.accepts
    parse = target.parse

    def one_input(data: bytes) -> None:
        with contextlib.suppress(*accepts):
            parse(data)

    atheris.Setup([sys.argv[0], *args[1:]], one_input)
    atheris.Fuzz()
    return 0  # pragma: no cover - atheris.Fuzz() exits the process itself


if __name__ == "__main__":
    sys.exit(main())
