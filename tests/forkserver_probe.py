"""What a child of the fork server sees (tests/test_forkserver.py runs it as `python -m tests.forkserver_probe`).

`STATUS`: prints it as one JSON line and exits with STATUS. `hang PIDFILE`: starts two sleepers (one in its own
process group, one in a session of its own, as a `cmd:` target is), writes their pids to PIDFILE and waits forever.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading

import numpy
import yaml


def _hang(pid_file: str) -> None:
    sleeper = [sys.executable, "-c", "import threading; threading.Event().wait()"]
    group = subprocess.Popen(sleeper)
    session = subprocess.Popen(sleeper, start_new_session=True)
    with open(pid_file + ".part", "w") as out:
        out.write(f"{group.pid} {session.pid}\n")
    os.rename(pid_file + ".part", pid_file)  # whole or absent, whenever the probe is killed
    print("started", flush=True)
    threading.Event().wait()  # until the fork server's client kills it past its bound


def main() -> None:
    if sys.argv[1] == "hang":
        _hang(sys.argv[2])
    seen_before = getattr(yaml, "_forkserver_probe_was_here", False)  # state an earlier run left, if any leaked
    yaml._forkserver_probe_was_here = True  # type: ignore[attr-defined]
    print(json.dumps({
        "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0), "cwd": os.getcwd(), "env": dict(os.environ),
        "argv": sys.argv, "path0": sys.path[0], "main": sys.modules["__main__"].__file__, "stdin": sys.stdin.read(),
        "random": random.random(), "numpy_random": float(numpy.random.random()), "threads": threading.active_count(),
        "kvconform_modules": sorted(m for m in sys.modules if m.startswith("kvconform")), "seen_before": seen_before,
    }))
    print("to stderr", file=sys.stderr)
    sys.exit(int(sys.argv[1]))


if __name__ == "__main__":
    main()
