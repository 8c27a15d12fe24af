"""The .ci/rdma lane: build or reuse the VM image, boot it, run the smoke inside, print timings.

Exit status: 0 when every smoke check passed or the lane skipped (one line saying why), 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from . import build
from .vm import VM, qemu_binary

SMOKE_CMD = "sh testbeds/rdma-vm/smoke.sh"


def cannot_install() -> str | None:
    """Why the lane cannot even install qemu here (then it skips), or None."""
    if qemu_binary() is not None:
        return None
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return "rdma-vm: skipped: no qemu-system-x86_64 and no root apt-get to install it (no RDMA testbed here)"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=".ci/rdma", description=__doc__.splitlines()[0])
    p.add_argument("--cache", type=Path, default=None)
    p.add_argument("--rebuild", action="store_true")
    p.add_argument("--timeout", type=float, default=300.0, help="bound of the boot plus smoke (s)")
    p.add_argument("--cached", action="store_true",
                   help="boot the newest built image as it is (no apt: another lane may be updating its lists)")
    args = p.parse_args(argv)
    reason = cannot_install()
    if reason:
        print(reason)
        return 0
    t0 = time.monotonic()
    found = build.find_cached(args.cache) if args.cached else None
    if args.cached and found is None:
        print("rdma-vm: no built image in the cache (.ci/rdma prepare builds it)")
        return 1
    art = found or build.ensure(args.cache, log=lambda s: print(f"  {s}", flush=True), rebuild=args.rebuild)
    t_build = time.monotonic() - t0
    with VM(art) as vm:
        try:
            res = vm.run(SMOKE_CMD, timeout=args.timeout, on_line=lambda s: print(f"vm| {s}", flush=True))
        finally:
            vm.cleanup()
    passed = [ln for ln in res.lines if ln.startswith("SMOKE-PASS")]
    failed = [ln for ln in res.lines if ln.startswith("SMOKE-FAIL")]
    boot = f"{res.boot_s:.1f} s" if res.boot_s is not None else "no READY marker"
    print(f"rdma-vm: image {art.dir.name}: {t_build:.1f} s (build or cache), boot to init {boot}, "
          f"boot+smoke {res.elapsed_s:.1f} s, total {time.monotonic() - t0:.1f} s")
    print(f"rdma-vm: smoke {len(passed)} passed, {len(failed)} failed, exit {res.exit_status}"
          + (" (TIMED OUT)" if res.timed_out else ""))
    return 0 if res.ok and passed and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
