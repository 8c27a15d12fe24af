"""Driver of the RDMA testbed VM: boot it, run one command inside with a bound, stream its output, stop it.

One boot runs one command (the root's init runs ``/mnt/run/cmd.sh`` and powers off), so a test gets a fresh
kernel state each time. The per-run directory is shared read-write over 9p as ``/mnt/run`` (``$KVCONFORM_VM_RUN``
inside): the command leaves result and evidence files in ``$KVCONFORM_VM_RUN/results``. The exit status comes
back both as ``exit_status`` in that directory and as a ``KVCONFORM-VM-EXIT n`` marker on the serial console.
The VM is always stopped: at the bound, on an exception, on KeyboardInterrupt and when the context ends.

``run`` boots and waits for the command's end. ``start`` boots and returns: the console is read by a thread
(qemu never blocks on a full pipe), ``wait_for`` waits (bounded) for a line the command prints, ``wait`` for
its end, while the caller talks to the VM over its `Links`: a NIC whose Ethernet frames qemu's socket netdev
carries over two loopback UDP ports (the RoCEv2 segment: `kvconform.rdma.roce.ethernet`), and a NIC on qemu's
user-mode network whose TCP ports are forwarded from 127.0.0.1 (side channels and iWARP). Inside, the NICs are
found by MAC (`testbeds/rdma-vm/links.sh`).
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
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


ROCE_MAC = "52:54:00:4b:00:02"  # the NIC on the RoCEv2 segment (qemu socket netdev)
TCP_MAC = "52:54:00:4b:00:03"  # the NIC on qemu's user-mode network (forwarded TCP ports)
GUEST_TCP_ADDRESS = "10.0.2.15"  # the guest on the user-mode network; the host's loopback is 10.0.2.2 there
HOST_FROM_GUEST = "10.0.2.2"


@dataclass(frozen=True)
class Links:
    """The VM's network, all of it ending on 127.0.0.1 of the host.

    ``roce``: (host's UDP port, qemu's UDP port) of the socket netdev carrying the RoCEv2 segment's frames.
    ``forwards``: (host TCP port on 127.0.0.1, guest TCP port on GUEST_TCP_ADDRESS) pairs of the user-mode NIC;
    the guest reaches the host's 127.0.0.1 ports at HOST_FROM_GUEST.
    """

    roce: tuple[int, int] | None = None
    forwards: tuple[tuple[int, int], ...] = ()

    def qemu_args(self) -> list[str]:
        if self.roce is None and not self.forwards:
            return ["-nic", "none"]
        args = ["-nic", "none"]
        if self.roce is not None:
            host_port, qemu_port = self.roce
            args += ["-netdev", f"socket,id=roce,udp=127.0.0.1:{host_port},localaddr=127.0.0.1:{qemu_port}",
                     "-device", f"virtio-net-pci,netdev=roce,mac={ROCE_MAC}"]
        fwd = "".join(f",hostfwd=tcp:127.0.0.1:{h}-{GUEST_TCP_ADDRESS}:{g}" for h, g in self.forwards)
        args += ["-netdev", f"user,id=tcp,net=10.0.2.0/24,host={HOST_FROM_GUEST},ipv6=off{fwd}",
                 "-device", f"virtio-net-pci,netdev=tcp,mac={TCP_MAC}"]
        return args


class VM:
    """One VM boot per :meth:`run` (or :meth:`start`); use as a context manager so qemu never outlives the
    caller."""

    def __init__(self, artefacts: Artefacts, *, project: Path = REPO, run_dir: Path | None = None,
                 memory_mb: int = 1024, qemu: str | None = None, links: Links | None = None) -> None:
        self.art = artefacts
        self.project = project
        self._own_run_dir = run_dir is None
        self.run_dir = run_dir if run_dir is not None else Path(tempfile.mkdtemp(prefix="rdma-vm-run-"))
        self.memory_mb = memory_mb
        self.qemu = qemu or qemu_binary() or "qemu-system-x86_64"
        self.links = links or Links()
        self.proc: subprocess.Popen[bytes] | None = None
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader: threading.Thread | None = None
        self._started = 0.0
        self._status: int | None = None
        self._boot_s: float | None = None
        self._eof = False
        self._failure: BaseException | None = None

    def __enter__(self) -> VM:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def command_line(self) -> list[str]:
        """qemu's argv: TCG, one vCPU, PVH vmlinux + small initramfs, four 9p shares (root, project and Python
        dependencies read-only, run read-write), the links' NICs."""
        shares = [("rootfs", self.art.root, True), ("project", self.project, True),
                  ("pydeps", self.art.pydeps, True), ("run", self.run_dir, False)]
        # -cpu max: the default qemu64 model lacks x86-64-v2 (SSE4.2, POPCNT), which numpy 2's wheels need
        # (they die with "Illegal instruction" at import)
        argv = [self.qemu, "-accel", "tcg", "-cpu", "max", "-smp", "1", "-m", str(self.memory_mb), "-display", "none",
                "-serial", "stdio", "-monitor", "none", "-no-reboot", *self.links.qemu_args(),
                "-kernel", str(self.art.vmlinux), "-initrd", str(self.art.initramfs),
                "-append", "console=ttyS0 quiet loglevel=3 panic=-1"]
        for i, (tag, path, ro) in enumerate(shares):
            argv += ["-fsdev", f"local,id=fs{i},path={path},security_model=none" + (",readonly=on" if ro else ""),
                     "-device", f"virtio-9p-pci,fsdev=fs{i},mount_tag={tag}"]
        return argv

    def run(self, command: str, timeout: float, on_line: Callable[[str], None] | None = None) -> RunResult:
        """Boot, run ``command`` (sh syntax, cwd = the project) inside, stream console lines; bounded by ``timeout``."""
        self.start(command, on_line)
        return self.wait(timeout)

    def start(self, command: str, on_line: Callable[[str], None] | None = None) -> None:
        """Boot with ``command`` as what the VM runs, and return; the console is read in the background."""
        if self.proc is not None:
            raise RuntimeError("the VM is already running")
        results = self.run_dir / "results"
        results.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "exit_status").unlink(missing_ok=True)
        # siw charges every memory region to RLIMIT_MEMLOCK even for root (8 MiB by default): a suite's regions
        # would run out after a few checks (ENOMEM from ibv_reg_mr, then from ibv_create_cq)
        (self.run_dir / "cmd.sh").write_text("ulimit -l unlimited\n" + command + "\n")
        self.lines, self._status, self._boot_s, self._eof, self._failure = [], None, None, False, None
        self._started = time.monotonic()
        self.proc = subprocess.Popen(self.command_line(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self._reader = threading.Thread(target=self._read, args=(self.proc, on_line), name="rdma-vm-console",
                                        daemon=True)
        self._reader.start()

    def _read(self, proc: subprocess.Popen[bytes], on_line: Callable[[str], None] | None) -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            with self._cond:
                self.lines.append(line)
                if line.startswith(READY) and self._boot_s is None:
                    self._boot_s = time.monotonic() - self._started
                m = _EXIT.search(line)
                if m:
                    self._status = int(m.group(1))
                self._cond.notify_all()
            if on_line is not None:
                try:
                    on_line(line)
                except BaseException as exc:  # the caller's callback gave up: the VM ends, wait() raises it
                    self._failure = exc
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    break
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        """The first console line matching ``pattern`` (a regex), waiting at most ``timeout`` seconds;
        TimeoutError naming the pattern and the last lines, also when the VM ended without printing it."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self.lines[seen:]:
                    m = rx.search(line)
                    if m:
                        return m
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    tail = "\n".join(self.lines[-15:])
                    why = "the VM ended" if self._eof else f"{timeout:g} s passed"
                    raise TimeoutError(f"rdma-vm: {why} before a line matching {pattern!r}; last lines:\n{tail}")
                self._cond.wait(left)

    def wait(self, timeout: float) -> RunResult:
        """Wait (at most ``timeout`` seconds from now) for the command's end; the VM is stopped either way."""
        deadline = time.monotonic() + timeout
        timed_out = False
        try:
            with self._cond:
                while not self._eof:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        timed_out = True
                        break
                    self._cond.wait(left)
        finally:
            self.stop()
        if self._failure is not None:
            raise self._failure
        status = self._status
        if status is None and not timed_out:
            status = self._status_file()
        results = self.run_dir / "results"
        return RunResult(exit_status=None if timed_out else status, timed_out=timed_out, lines=list(self.lines),
                         run_dir=self.run_dir, elapsed_s=time.monotonic() - self._started, boot_s=self._boot_s,
                         files=sorted(p for p in results.rglob("*") if p.is_file()))

    def _status_file(self) -> int | None:
        try:
            return int((self.run_dir / "exit_status").read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """Stop qemu (SIGTERM, then SIGKILL after STOP_GRACE_S) and whatever else its process group holds;
        idempotent. Returns once nothing of the group runs (bounded by STOP_GRACE_S + 20 s)."""
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
        proc.wait(10)
        # qemu is gone, but the group may hold a straggler that has not yet acted on the signal (a fake qemu's
        # children): it is killed and waited for, so "stopped" means nothing of the run is left
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        _wait_group_gone(proc.pid, 10.0)
        if self._reader is not None:
            self._reader.join(10)  # the pipe is closed once qemu and its group are gone
            self._reader = None
        if proc.stdout is not None:
            proc.stdout.close()

    def cleanup(self) -> None:
        """Remove the run directory when this VM made it."""
        if self._own_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)


def _group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``, from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            # the fields after the command name, which may itself hold spaces and parentheses
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def _wait_group_gone(pgid: int, timeout: float) -> None:
    """Wait, at most ``timeout`` seconds, for each live member of a killed group to exit: a pidfd becomes
    readable at its process's exit, whoever reaps it. Names a member that outlives the bound on stderr."""
    deadline = time.monotonic() + timeout
    for pid in _group_members(pgid):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        finally:
            os.close(fd)
        if not ready:
            print(f"rdma-vm: process {pid} of the VM's group {pgid} outlived SIGKILL by {timeout:g} s",
                  file=sys.stderr)
