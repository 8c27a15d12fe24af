"""A `cmd:` KVCS consumer whose result file the harness cannot read (issue 10): it connects to nothing and
writes the result JSON named by ``--kind``, then exits 0.

    python tests/kvcs/cmd_bad_result_consumer.py --kind segments --relay {relay} --cache {cache} --out {out}

Kinds: ``segments`` (a segments entry that is an empty list: the IndexError of issue 10), ``digest`` (a layer
digest that is not hex), ``layers`` (layers a list), ``nested`` (1000 nested arrays), ``not-json``,
``bigint`` (a 5000-digit layer number).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

RESULTS = {
    "segments": '{"publication": null, "layers": {"0": {"digest": "failed"}}, "segments": [[]]}',
    "digest": '{"publication": null, "layers": {"0": {"digest": "zz"}}}',
    "layers": '{"publication": null, "layers": [[0, "failed"]]}',
    "nested": '{"layers": ' + "[" * 1000 + "]" * 1000 + "}",
    "not-json": "layers: all good\n",
    "bigint": '{"layers": {"' + "7" * 5000 + '": {"digest": "failed"}}}',
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kind", choices=sorted(RESULTS), required=True)
    parser.add_argument("--relay", required=True)
    parser.add_argument("--cache", required=True)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    args.out.write_text(RESULTS[args.kind], "utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
