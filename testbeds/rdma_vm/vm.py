"""Driver of the RDMA testbed VM: boot it, run one command inside with a bound, stream its output, stop it.

One boot runs one command (the root's init runs ``/mnt/run/cmd.sh`` and powers off), so a test gets a fresh
kernel state each time. The per-run directory is shared read-write over 9p as ``/mnt/run`` (``$KVCONFORM_VM_RUN``
inside): the command leaves result and evidence files in ``$KVCONFORM_VM_RUN/results``. The exit status comes
back both as ``exit_status`` in that directory and as a ``KVCONFORM-VM-EXIT n`` marker on the serial console.
The VM is always stopped: at the bound, on an exception, on KeyboardInterrupt and when the context ends.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from .build import REPO, Artefacts, find_cached

QEMU_ENV = "KVCONFORM_QEMU"
READY = "KVCONFORM-VM-READY"
_EXIT = re.compile(r"KVCONFORM-VM-EXIT (\d+)")
# After SIGTERM qemu gets this long before SIGKILL.
STOP_GRACE_S = 3.0


def qemu_binary() -> str | None:
    """``$KVCONFORM_QEMU`` or qemu-system-x86_64 on PATH."""
    return os.environ.get(QEMU_ENV) or shutil.which("qemu-system-x86_64")


def skip_reason(cache: Path | None = None) -> str | None:
    """One line saying why the VM cannot run here, or None when qemu and a built image are present."""
    if qemu_binary() is None:
        return ("rdma-vm: skipped: qemu-system-x86_64 not found "
                "(apt-get install qemu-system-x86, then testbeds/rdma-vm/build)")
    if find_cached(cache) is None:
        return "rdma-vm: skipped: no built VM image in the cache (run testbeds/rdma-vm/build)"
    return None


@dataclass
class RunResult:
    """What one command in the VM produced."""

    exit_status: int | None          # None when the bound fired or the VM died before the command ended
    timed_out: bool
    lines: list[str]                 # the whole serial console (kernel, init and the command's output)
    run_dir: Path
    elapsed_s: float
    boot_s: float | None = None      # until the init's READY marker
    files: list[Path] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_status == 0 and not self.timed_out


class VM:
    """One VM boot per :meth:`run`; use as a context manager so qemu never outlives the caller."""

    def __init__(self, artefacts: Artefacts, *, project: Path = REPO, run_dir: Path | None = None,
                 memory_mb: int = 1024, qemu: str | None = None) -> None:
        self.art = artefacts
        self.project = project
        self._own_run_dir = run_dir is None
        self.run_dir = run_dir if run_dir is not None else Path(tempfile.mkdtemp(prefix="rdma-vm-run-"))
        self.memory_mb = memory_mb
        self.qemu = qemu or qemu_binary() or "qemu-system-x86_64"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> VM:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def command_line(self) -> list[str]:
        """qemu's argv: TCG, one vCPU, PVH vmlinux + small initramfs, three 9p shares (root ro, project ro, run rw)."""
        shares = [("rootfs", self.art.root, True), ("project", self.project, True),
                  ("pydeps", self.art.pydeps, True), ("run", self.run_dir, False)]
        argv = [self.qemu, "-accel", "tcg", "-smp", "1", "-m", str(self.memory_mb), "-display", "none",
                "-serial", "stdio", "-monitor", "none", "-no-reboot", "-nic", "none",
                "-kernel", str(self.art.vmlinux), "-initrd", str(self.art.initramfs),
                "-append", "console=ttyS0 quiet loglevel=3 panic=-1"]
        for i, (tag, path, ro) in enumerate(shares):
            argv += ["-fsdev", f"local,id=fs{i},path={path},security_model=none" + (",readonly=on" if ro else ""),
                     "-device", f"virtio-9p-pci,fsdev=fs{i},mount_tag={tag}"]
        return argv

    def run(self, command: str, timeout: float, on_line: Callable[[str], None] | None = None) -> RunResult:
        """Boot, run ``command`` (sh syntax, cwd = the project) inside, stream console lines; bounded by ``timeout``."""
        if self.proc is not None:
            raise RuntimeError("the VM is already running")
        results = self.run_dir / "results"
        results.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "exit_status").unlink(missing_ok=True)
        (self.run_dir / "cmd.sh").write_text(command + "\n")
        started = time.monotonic()
        deadline = started + timeout
        lines: list[str] = []
        status: int | None = None
        boot_s: float | None = None
        timed_out = False
        try:
            self.proc = subprocess.Popen(self.command_line(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, start_new_session=True)
            assert self.proc.stdout is not None
            fd = self.proc.stdout.fileno()
            os.set_blocking(fd, False)
            buf = b""
            with selectors.DefaultSelector() as sel:
                sel.register(fd, selectors.EVENT_READ)
                eof = False
                while not eof:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        timed_out = True
                        break
                    if not sel.select(min(left, 1.0)):
                        continue
                    chunk = os.read(fd, 65536)
                    eof = not chunk
                    buf += chunk
                    *complete, buf = buf.split(b"\n")
                    if eof and buf:
                        complete.append(buf)
                    for raw in complete:
                        line = raw.decode("utf-8", "replace").rstrip("\r")
                        lines.append(line)
                        if line.startswith(READY) and boot_s is None:
                            boot_s = time.monotonic() - started
                        m = _EXIT.search(line)
                        if m:
                            status = int(m.group(1))
                        if on_line is not None:
                            on_line(line)
        finally:
            self.stop()
        if status is None and not timed_out:
            status = self._status_file()
        return RunResult(exit_status=None if timed_out else status, timed_out=timed_out, lines=lines,
                         run_dir=self.run_dir, elapsed_s=time.monotonic() - started, boot_s=boot_s,
                         files=sorted(p for p in results.rglob("*") if p.is_file()))

    def _status_file(self) -> int | None:
        try:
            return int((self.run_dir / "exit_status").read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """Stop qemu (SIGTERM, then SIGKILL after STOP_GRACE_S); idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            for sig, grace in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
        else:
            # qemu exited (poweroff) but the group may hold a straggler (a fake qemu's children).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()

    def cleanup(self) -> None:
        """Remove the run directory when this VM made it."""
        if self._own_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
