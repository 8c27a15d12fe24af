"""What the kvconform pytest plugin costs a pytest session that does not use it (issue 14).

    python bench/bench_plugin_overhead.py [--runs N] [--json FILE]

The entry point ``kvconform`` is loaded into every pytest session of an environment with kvconform
installed. In an empty folder holding one trivial test, this times ``python -m pytest --co -q`` as a whole
process, with the plugin and with ``-p no:kvconform``, the two in turn (A B A B ...) so a drift of a shared
machine hits both alike, and prints each one's median wall time and the median of the per-pair ratios. It
also lists the kvconform and third-party modules the plugin added, from ``python -X importtime``: the cause
of a cost, where the ratio is only its size (the entry point's own module, loaded by importlib, is not listed
by importtime; what it imports is).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRIVIAL = "def test_one():\n    assert 1 + 1 == 2\n"


def _run(folder: Path, extra: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", *extra], cwd=folder,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    return time.perf_counter() - start


def _imported(folder: Path, extra: list[str]) -> set[str]:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider",
                           *extra], cwd=folder, capture_output=True, text=True, timeout=120, check=True)
    return {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="pairs of runs (default 7), after one warm-up pair")
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "test_trivial.py").write_text(TRIVIAL)
        _run(folder, [])
        _run(folder, ["-p", "no:kvconform"])
        with_plugin, without, ratios = [], [], []
        for _ in range(args.runs):
            a, b = _run(folder, []), _run(folder, ["-p", "no:kvconform"])
            with_plugin.append(a)
            without.append(b)
            ratios.append(a / b)
        added = _imported(folder, []) - _imported(folder, ["-p", "no:kvconform"])
    stdlib = sys.stdlib_module_names
    result = {
        "runs": args.runs,
        "with_plugin_s": statistics.median(with_plugin),
        "without_plugin_s": statistics.median(without),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "modules_added": sorted(m for m in added if m.split(".")[0] not in stdlib),
    }
    print(f"pytest --co -q, one trivial test, {args.runs} pairs: with the plugin {result['with_plugin_s']:.3f} s, "
          f"with -p no:kvconform {result['without_plugin_s']:.3f} s (medians); ratio {result['ratio']:.3f} "
          f"(min {result['ratio_min']:.3f}, max {result['ratio_max']:.3f})")
    print("modules the plugin added (not stdlib): " + (", ".join(result["modules_added"]) or "none"))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
