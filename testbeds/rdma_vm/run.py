"""Run one command inside the RDMA testbed VM (boot, stream the console, stop): the developer's way in.

    python -m kvconform.testbeds.rdma_vm.run [--timeout S] [--results DIR] -- 'sh command line'

The command runs with cwd = the project share and ``$KVCONFORM_VM_RUN/results`` for files to bring back
(copied to ``--results`` when given). Exits with the command's status (124 when the bound fired).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from .build import find_cached
from .vm import VM, skip_reason


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvconform.testbeds.rdma_vm.run", description=__doc__.splitlines()[0])
    p.add_argument("--timeout", type=float, default=600.0, help="bound of boot plus command (s)")
    p.add_argument("--results", type=Path, default=None, help="copy $KVCONFORM_VM_RUN/results here")
    p.add_argument("--kernel-log", action="store_true", help="also print the kernel's console lines")
    p.add_argument("command", nargs="+")
    args = p.parse_args(argv)
    why = skip_reason()
    if why:
        print(why, file=sys.stderr)
        return 2
    art = find_cached()
    assert art is not None
    with VM(art) as vm:
        try:
            res = vm.run(" ".join(args.command), timeout=args.timeout,
                         on_line=lambda s: print(s, flush=True) if args.kernel_log or not s.startswith("[") else None)
            if args.results is not None:
                shutil.copytree(res.run_dir / "results", args.results, dirs_exist_ok=True)
        finally:
            vm.cleanup()
    print(f"rdma-vm: boot {res.boot_s or float('nan'):.1f} s, total {res.elapsed_s:.1f} s, exit {res.exit_status}"
          + (" (TIMED OUT)" if res.timed_out else ""), file=sys.stderr)
    return 124 if res.timed_out else (res.exit_status if res.exit_status is not None else 1)


if __name__ == "__main__":
    sys.exit(main())
