"""Run one command inside the RDMA testbed VM (boot, stream the console, stop): the developer's way in.

    python -m kvconform.testbeds.rdma_vm.run [--timeout S] [--results DIR] [--netem SPEC [--netem-dev IF]] \
        -- 'sh command line'

The command runs with cwd = the project share and ``$KVCONFORM_VM_RUN/results`` for files to bring back
(copied to ``--results`` when given). Exits with the command's status (124 when the bound fired). ``--netem
loss=0.01,reorder=0.01,dup=0.01,delay=5ms`` (the ``--impair`` grammar, unseeded: kvconform.testbeds.rdma_vm.netem)
first puts `tc netem` on ``--netem-dev`` (default lo: the in-VM pair's siw0 traffic; rxe0 loops back under no
qdisc) and records it in the reports of the runs the command makes (coverage.json meta.netem).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
from pathlib import Path

from .build import find_cached
from .netem import Netem, vm_env
from .vm import VM, skip_reason


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvconform.testbeds.rdma_vm.run", description=__doc__.splitlines()[0])
    p.add_argument("--timeout", type=float, default=600.0, help="bound of boot plus command (s)")
    p.add_argument("--results", type=Path, default=None, help="copy $KVCONFORM_VM_RUN/results here")
    p.add_argument("--kernel-log", action="store_true", help="also print the kernel's console lines")
    p.add_argument("--netem", type=Netem.parse, default=None, metavar="SPEC",
                   help="tc netem inside the VM first: loss=P,reorder=P,dup=P,delay=5ms (no seed: netem has none)")
    p.add_argument("--netem-dev", action="append", default=[], metavar="IF",
                   help="the interface(s) netem goes on (default lo)")
    p.add_argument("command", nargs="+")
    args = p.parse_args(argv)
    command = " ".join(args.command)
    if args.netem is not None:
        command = netem_prefix(args.netem, args.netem_dev or ["lo"]) + command
    why = skip_reason()
    if why:
        print(why, file=sys.stderr)
        return 2
    art = find_cached()
    assert art is not None
    with VM(art) as vm:
        try:
            res = vm.run(command, timeout=args.timeout,
                         on_line=lambda s: print(s, flush=True) if args.kernel_log or not s.startswith("[") else None)
            if args.results is not None:
                shutil.copytree(res.run_dir / "results", args.results, dirs_exist_ok=True)
        finally:
            vm.cleanup()
    print(f"rdma-vm: boot {res.boot_s or float('nan'):.1f} s, total {res.elapsed_s:.1f} s, exit {res.exit_status}"
          + (" (TIMED OUT)" if res.timed_out else ""), file=sys.stderr)
    return 124 if res.timed_out else (res.exit_status if res.exit_status is not None else 1)


def netem_prefix(netem: Netem, devices: list[str]) -> str:
    """The shell lines that put ``netem`` on ``devices`` before a command (testbeds/rdma-vm/netem.sh)."""
    return (f"export {vm_env(netem).strip()}\n. testbeds/rdma-vm/netem.sh\n"
            f"netem_apply {' '.join(shlex.quote(d) for d in devices)} || exit 1\n")


if __name__ == "__main__":
    sys.exit(main())
