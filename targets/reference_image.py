"""The entrypoint of the reference image (testbeds/docker/reference): kvconform's reference implementations
under the container contract (docs/docker-contract.md, ``targets/contract.py``).

``python -m kvconform.targets.reference_image <role> --<name> <value> ...`` execs the reference tool that plays
the role (``kvconform tlkv export``, ``kvconform serve tlkv-decode``, ...), so the tool is the container's PID 1
and gets the harness's SIGTERM itself; a role it does not play is declared with ``kvconform-unsupported`` and
exit 127. The image's ``org.kvconform.contract.optional`` label (``OPTIONAL``) lists the optional placeholders
read here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

__all__ = ["OPTIONAL", "main", "optional_label", "parse_arguments", "reference_argv"]

# The optional placeholders each role reads (the image's org.kvconform.contract.optional label).
OPTIONAL: dict[str, tuple[str, ...]] = {
    "tlkv-reader": ("pool", "versions"),
    "tlkv-decode": ("pool", "versions"),
    "kvcs-publisher": ("token",),
    "kvcs-consumer": ("relay2", "token", "budget", "producer_key", "layers", "blocks"),
}


def optional_label() -> str:
    """The value of the image's ``org.kvconform.contract.optional`` label."""
    return " ".join(f"{role}:{name}" for role, names in OPTIONAL.items() for name in names)


def parse_arguments(argv: Sequence[str]) -> tuple[str, dict[str, str]]:
    """``<role> --<name> <value> ...`` -> (role, {name: value}); ValueError for anything else."""
    if not argv:
        raise ValueError("expected <role> --<name> <value> ...")
    role, rest = argv[0], list(argv[1:])
    if len(rest) % 2:
        raise ValueError(f"{role}: arguments {rest!r} are not --<name> <value> pairs")
    values: dict[str, str] = {}
    for flag, value in zip(rest[::2], rest[1::2], strict=True):
        if not flag.startswith("--"):
            raise ValueError(f"{role}: argument {flag!r}: expected --<name>")
        values[flag[2:].replace("-", "_")] = value
    return role, values


def _opt(values: Mapping[str, str], name: str, flag: str) -> list[str]:
    return [flag, values[name]] if values.get(name) else []


def reference_argv(role: str, v: Mapping[str, str]) -> list[str] | None:
    """The reference tool's command line that plays ``role`` with these values; None for a role it does not play.
    KeyError names a required value that is missing."""
    tool = [sys.executable, "-m", "kvconform"]
    host = v.get("host", "127.0.0.1")
    if role == "tlkv-writer":
        return [*tool, "tlkv", "export", "--sequence", v["sequence"], "--out", v["out"]]
    if role == "tlkv-reader":
        return [*tool, "tlkv", "import", "--envelope", v["envelope"], "--pool", v["pool"], *_opt(v, "versions",
                "--versions"), "--out", v["out"]]
    if role == "tlkv-prefill":
        return [*tool, "tlkv", "prefill", "--decode", v["decode_addr"], "--sequence", v["sequence"]]
    if role == "tlkv-decode":
        return [*tool, "serve", "tlkv-decode", "--host", host, "--port", v["port"], *_opt(v, "pool", "--pool"),
                *_opt(v, "versions", "--versions")]
    if role in ("moqt-relay", "kvcs-relay"):
        return [*tool, "serve", "moqt-relay", "--host", host, "--port", v["port"], "--policy", v["policy"]]
    if role == "kvcs-publisher":
        return [*tool, "serve", "kvcs-publisher", "--relay", v["relay"], "--cache", v["cache"],
                *_opt(v, "token", "--token")]
    if role == "kvcs-consumer":
        argv = [*tool, "kvcs", "fetch", "--relay", v["relay"]]
        if v.get("relay2") and v["relay2"] != v["relay"]:
            argv += ["--relay", v["relay2"]]
        argv += ["--cache", v["cache"], "--out", v["out"], *_opt(v, "token", "--token"), *_opt(v, "budget", "--budget"),
                 *_opt(v, "layers", "--layers"), *_opt(v, "blocks", "--blocks")]
        for key in filter(None, v.get("producer_key", "").split(",")):
            argv += ["--producer-key", key]
        return argv
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Exec the reference tool of the role; 127 with ``kvconform-unsupported`` for a role it does not play."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        role, values = parse_arguments(args)
        command = reference_argv(role, {"host": os.environ.get("KVCONFORM_HOST", "127.0.0.1"), **values})
    except ValueError as exc:
        print(f"kvconform reference image: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyError as exc:
        print(f"kvconform reference image: {args[0]}: missing --{str(exc.args[0]).replace('_', '-')}",
              file=sys.stderr, flush=True)
        return 2
    if command is None:
        print(f"kvconform-unsupported role={role}", flush=True)
        return 127
    sys.stdout.flush()
    os.execv(command[0], command)


if __name__ == "__main__":
    sys.exit(main())
