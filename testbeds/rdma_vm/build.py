"""Build (or reuse from the cache) the RDMA testbed VM's boot artefacts, from Debian packages only.

Layout of one cache entry (``<cache>/<key>/``)::

    vmlinux          uncompressed kernel (PVH entry: qemu boots it directly, the fastest boot measured)
    initramfs.cpio   busybox plus the virtio and 9p modules; mounts the root share and switches to it
    root/            debootstrap --variant=minbase bookworm + rdma-core & co., the kernel's modules and siw.ko
    pydeps/          the project's Python dependencies (pip install --target) for the VM's python3.11
    manifest.json    the versions that went into the entry (the key is a hash of them)

The key covers the kernel package version, rdma-core's version and RECIPE_VERSION, so an upgraded package or a
changed recipe builds a new entry instead of booting a stale one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kvconform.testbeds.apt_mirror import debian_mirror

# Bump when the recipe changes what it produces (init scripts, package list, layout).
RECIPE_VERSION = "1"
CACHE_ENV = "KVCONFORM_RDMA_VM_CACHE"
APT_WAIT = ("-o", "DPkg::Lock::Timeout=300")  # another lane's apt-get may hold the lock: wait, bounded
SUITE = "bookworm"
HOST_PACKAGES = ("qemu-system-x86", "debootstrap", "busybox-static", "cpio", "make", "xz-utils", "kmod")
# iproute2 also brings tc, which testbeds/rdma-vm/netem.sh needs (sch_netem is in kernel/net, kept whole)
ROOT_PACKAGES = ("rdma-core", "ibverbs-utils", "rdmacm-utils", "ibverbs-providers", "python3-pyverbs",
                 "iproute2", "kmod", "perftest", "procps")
# Modules the initramfs loads before it can mount the root share (virtio transport and 9p).
INITRD_MODULES = ("virtio_pci", "9pnet_virtio", "9p")
# kernel/drivers/* directories the VM's root keeps (see _skip_unneeded_drivers).
KEEP_DRIVERS = frozenset({"infiniband", "net", "virtio", "char", "block"})
REPO = Path(__file__).resolve().parents[2]

Log = Callable[[str], None]


def default_cache_dir() -> Path:
    """The cache root: ``$KVCONFORM_RDMA_VM_CACHE`` or ``~/.cache/kvconform/rdma-vm``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "kvconform" / "rdma-vm"


@dataclass(frozen=True)
class Versions:
    """What goes into one cache entry; ``key`` changes whenever one of them does."""

    kernel_abi: str        # e.g. 6.1.0-50-amd64 (the modules directory name)
    kernel_package: str    # the Debian version of linux-image-<abi>, e.g. 6.1.176-1
    rdma_core: str         # Debian version of rdma-core
    recipe: str = ""       # RECIPE_VERSION plus a hash of the init scripts and package lists (recipe_id())
    pydeps: str = ""       # hash of the project's runtime dependency list

    @property
    def key(self) -> str:
        blob = json.dumps(self.as_dict(), sort_keys=True).encode()
        return f"{self.kernel_abi}-rdma{self.rdma_core}-r{self.recipe}-{hashlib.sha256(blob).hexdigest()[:12]}"

    def as_dict(self) -> dict[str, str]:
        return {"kernel_abi": self.kernel_abi, "kernel_package": self.kernel_package, "rdma_core": self.rdma_core,
                "recipe": self.recipe, "pydeps": self.pydeps}


@dataclass(frozen=True)
class Artefacts:
    """Paths of a complete cache entry."""

    dir: Path

    @property
    def vmlinux(self) -> Path:
        return self.dir / "vmlinux"

    @property
    def initramfs(self) -> Path:
        return self.dir / "initramfs.cpio"

    @property
    def root(self) -> Path:
        return self.dir / "root"

    @property
    def pydeps(self) -> Path:
        return self.dir / "pydeps"

    @property
    def manifest(self) -> Path:
        return self.dir / "manifest.json"

    def complete(self) -> bool:
        # The manifest is written last: its presence means the entry is whole.
        return self.manifest.is_file() and self.vmlinux.is_file() and self.initramfs.is_file()


def _run(cmd: list[str], log: Log, timeout: float, **kw: object) -> str:
    log("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return str(proc.stdout)


def pydeps_hash(pyproject: Path = REPO / "pyproject.toml") -> str:
    """Hash of the project's runtime dependencies (a change re-runs pip for the VM)."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return hashlib.sha256("\n".join(sorted(deps)).encode()).hexdigest()[:12]


def _apt_env() -> dict[str, str]:
    return {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}


def install_host_packages(log: Log) -> None:
    """qemu, debootstrap, busybox and the build tools, from apt (skipped when all are present)."""
    probes = {"qemu-system-x86": "qemu-system-x86_64", "debootstrap": "debootstrap", "cpio": "cpio",
              "make": "make", "xz-utils": "xz", "kmod": "depmod"}
    missing = [p for p, exe in probes.items() if shutil.which(exe) is None]
    if not Path("/bin/busybox").exists() and not Path("/usr/bin/busybox").exists():
        missing.append("busybox-static")
    if missing:
        _run(["apt-get", *APT_WAIT, "update", "-q"], log, 300, env=_apt_env())
        _run(["apt-get", *APT_WAIT, "install", "-y", "-q", "--no-install-recommends", *missing], log, 900,
             env=_apt_env())


def resolve_versions(log: Log) -> Versions:
    """The kernel ABI behind linux-image-amd64 and the candidate versions, as the mirror has them today."""
    out = _run(["apt-cache", "depends", "linux-image-amd64"], log, 60)
    abi = next(line.split("linux-image-", 1)[1].strip() for line in out.splitlines()
               if "Depends: linux-image-" in line)
    return Versions(kernel_abi=abi, kernel_package=_candidate(f"linux-image-{abi}", log),
                    rdma_core=_candidate("rdma-core", log), recipe=recipe_id(), pydeps=pydeps_hash())


def recipe_id() -> str:
    """RECIPE_VERSION and a hash of what the recipe bakes into the image, so editing an init script rebuilds."""
    blob = "\0".join([INITRD_INIT, VM_INIT, *ROOT_PACKAGES, *INITRD_MODULES, *sorted(KEEP_DRIVERS)]).encode()
    return f"{RECIPE_VERSION}.{hashlib.sha256(blob).hexdigest()[:8]}"


def _candidate(package: str, log: Log) -> str:
    out = _run(["apt-cache", "policy", package], log, 60)
    for line in out.splitlines():
        if line.strip().startswith("Candidate:"):
            return line.split(":", 1)[1].strip()
    raise RuntimeError(f"apt has no candidate for {package}")


def extract_vmlinux(bzimage: bytes) -> bytes:
    """The ELF kernel inside a bzImage: find the compressed payload and inflate it (like scripts/extract-vmlinux)."""
    for magic, inflate in ((b"\xfd7zXZ\x00", _unxz), (b"\x1f\x8b\x08", _gunzip)):
        start = bzimage.find(magic)
        while start >= 0:
            try:
                data = inflate(bzimage[start:])
            except (lzma.LZMAError, zlib.error, EOFError):
                data = b""
            if data[:4] == b"\x7fELF":
                return data
            start = bzimage.find(magic, start + 1)
    raise RuntimeError("no xz or gzip ELF payload in the kernel image")


def _unxz(data: bytes) -> bytes:
    return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data)


def _gunzip(data: bytes) -> bytes:
    return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data)


def _download(packages: list[str], into: Path, log: Log) -> list[Path]:
    into.mkdir(parents=True, exist_ok=True)
    _run(["apt-get", "download", *packages], log, 900, cwd=into)
    return sorted(into.glob("*.deb"))


def build_kernel(v: Versions, art: Artefacts, work: Path, log: Log) -> Path:
    """vmlinux and the kernel's modules; returns the extracted package tree."""
    debs = _download([f"linux-image-{v.kernel_abi}"], work / "kdeb", log)
    tree = work / "kernel"
    for deb in debs:
        _run(["dpkg-deb", "-x", str(deb), str(tree)], log, 300)
    art.vmlinux.write_bytes(extract_vmlinux((tree / "boot" / f"vmlinuz-{v.kernel_abi}").read_bytes()))
    # The package ships no modules.dep (its postinst runs depmod): make it for the initramfs' load order.
    _run(["depmod", "-b", str(tree), v.kernel_abi], log, 120)
    return tree


def build_siw(v: Versions, work: Path, log: Log) -> Path:
    """siw.ko out of tree: drivers/infiniband/sw/siw from linux-source-6.1 against linux-headers-<abi>."""
    headers = Path(f"/usr/src/linux-headers-{v.kernel_abi}")
    if not headers.is_dir():
        _run(["apt-get", *APT_WAIT, "install", "-y", "-q", "--no-install-recommends", f"linux-headers-{v.kernel_abi}"],
             log, 900, env=_apt_env())
    major = ".".join(v.kernel_abi.split(".")[:2])
    src = _download([f"linux-source-{major}"], work / "srcdeb", log)
    _run(["dpkg-deb", "-x", str(src[0]), str(work / "src")], log, 300)
    tarball = next((work / "src" / "usr" / "src").glob("linux-source-*.tar.*"))
    top = tarball.name.split(".tar")[0]
    _run(["tar", "-xf", str(tarball), "-C", str(work), f"{top}/drivers/infiniband/sw/siw"], log, 600)
    siw = work / top / "drivers" / "infiniband" / "sw" / "siw"
    _run(["make", "-C", str(headers), f"M={siw}", "CONFIG_RDMA_SIW=m", "-j2", "modules"], log, 600)
    return siw / "siw.ko"


def build_root(v: Versions, art: Artefacts, kernel: Path, siw_ko: Path, log: Log) -> None:
    """debootstrap minbase + the RDMA userland, the kernel's modules (with siw.ko) and the VM's init."""
    _run(["debootstrap", "--variant=minbase", f"--include={','.join(ROOT_PACKAGES)}", SUITE, str(art.root),
          debian_mirror()], log, 1200)
    _run(["chroot", str(art.root), "apt-get", "clean"], log, 60)
    mods = art.root / "lib" / "modules"
    shutil.rmtree(mods, ignore_errors=True)
    shutil.copytree(kernel / "lib" / "modules", mods, symlinks=True, ignore=_skip_unneeded_drivers)
    extra = mods / v.kernel_abi / "extra"
    extra.mkdir(parents=True, exist_ok=True)
    shutil.copy2(siw_ko, extra / "siw.ko")
    _run(["depmod", "-b", str(art.root), v.kernel_abi], log, 120)
    init = art.root / "kvconform-init"
    init.write_text(VM_INIT)
    init.chmod(0o755)
    for d in ("project", "run", "pydeps"):
        (art.root / "mnt" / d).mkdir(parents=True, exist_ok=True)


def _skip_unneeded_drivers(directory: str, names: list[str]) -> set[str]:
    """copytree filter: of kernel/drivers keep the RDMA stack, virtio and top-level net drivers (dummy).

    The rest (GPU, sound, wireless, NIC drivers: about 270 MB) is hardware a TCG guest without devices never
    loads; arch, crypto, lib, net and fs stay whole (siw asks crypto for crc32c, rxe needs the UDP tunnels).
    """
    path = Path(directory)
    if path.name == "drivers" and path.parent.name == "kernel":
        return {n for n in names if n not in KEEP_DRIVERS}
    if path.name == "net" and path.parent.name == "drivers":
        return {n for n in names if (path / n).is_dir()}
    if path.name == "kernel" and path.parent.parent.name == "modules":
        return {"sound"} & set(names)
    return set()


def build_pydeps(art: Artefacts, log: Log) -> None:
    """The project's runtime dependencies for the VM's python3.11 (same ABI as the host's)."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    _run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target",
          str(art.pydeps), "--python-version", "3.11", "--only-binary=:all:", *deps], log, 1200)


def build_initramfs(v: Versions, art: Artefacts, kernel: Path, work: Path, log: Log) -> None:
    """busybox + the virtio/9p modules in dependency order + /init that switches to the 9p root."""
    moddir = kernel / "lib" / "modules" / v.kernel_abi
    order = module_load_order(moddir, INITRD_MODULES)
    rd = work / "initrd"
    for d in ("bin", "dev", "proc", "sys", "newroot", "lib/modules"):
        (rd / d).mkdir(parents=True, exist_ok=True)
    busybox = Path("/bin/busybox") if Path("/bin/busybox").exists() else Path("/usr/bin/busybox")
    shutil.copy2(busybox, rd / "bin" / "busybox")
    for applet in ("sh", "mount", "insmod", "switch_root", "mkdir", "echo", "cat"):
        (rd / "bin" / applet).symlink_to("busybox")
    names = []
    for rel in order:
        src = moddir / rel
        name = Path(rel).name.removesuffix(".xz").removesuffix(".zst")
        data = src.read_bytes()
        if rel.endswith(".xz"):
            data = lzma.decompress(data)
        (rd / "lib" / "modules" / name).write_bytes(data)
        names.append(name)
    init = rd / "init"
    init.write_text(INITRD_INIT.replace("@MODULES@", " ".join(names)))
    init.chmod(0o755)
    files = _run(["find", ".", "-mindepth", "1"], log, 60, cwd=rd)
    cpio = subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], input=files.encode(), cwd=rd,
                          capture_output=True, check=True, timeout=120)
    art.initramfs.write_bytes(cpio.stdout)


def module_load_order(moddir: Path, wanted: tuple[str, ...]) -> list[str]:
    """Paths (relative to moddir) of ``wanted`` and their dependencies, dependencies first (modules.dep).

    Built-in modules are absent from modules.dep and skipped.
    """
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (moddir / "modules.dep").read_text().splitlines():
        path, _, rest = line.partition(":")
        deps[path] = rest.split()
        by_name[Path(path).name.split(".ko")[0].replace("-", "_")] = path
    order: list[str] = []

    def visit(path: str) -> None:
        if path in order:
            return
        for dep in deps.get(path, []):
            visit(dep)
        order.append(path)

    for name in wanted:
        if name.replace("-", "_") in by_name:
            visit(by_name[name.replace("-", "_")])
    return order


def ensure(cache: Path | None = None, log: Log = print, rebuild: bool = False) -> Artefacts:
    """The cache entry for today's versions, built from scratch when absent (or when ``rebuild``)."""
    install_host_packages(log)
    versions = resolve_versions(log)
    art = Artefacts((cache or default_cache_dir()) / versions.key)
    if art.complete() and not rebuild:
        log(f"rdma-vm: cached {art.dir}")
        return art
    started = time.monotonic()
    if art.dir.exists():
        shutil.rmtree(art.dir)
    art.dir.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="rdma-vm-build-") as tmp:
        work = Path(tmp)
        kernel = build_kernel(versions, art, work, log)
        siw_ko = build_siw(versions, work, log)
        build_initramfs(versions, art, kernel, work, log)
        build_root(versions, art, kernel, siw_ko, log)
    build_pydeps(art, log)
    art.manifest.write_text(json.dumps({**versions.as_dict(), "key": versions.key,
                                        "build_s": round(time.monotonic() - started, 1)}, indent=2))
    log(f"rdma-vm: built {art.dir} in {time.monotonic() - started:.0f} s")
    return art


def find_cached(cache: Path | None = None) -> Artefacts | None:
    """A complete cache entry without asking apt (for skips): the newest one, or None."""
    root = cache or default_cache_dir()
    entries = sorted((Artefacts(p) for p in root.glob("*") if p.is_dir()), key=lambda a: a.dir.stat().st_mtime)
    complete = [a for a in entries if a.complete()]
    return complete[-1] if complete else None


# /init of the initramfs: load virtio/9p, mount the root share read-only, hand over to the root's init.
INITRD_INIT = """#!/bin/sh
mount -t proc proc /proc
mount -t devtmpfs dev /dev
for m in @MODULES@; do insmod /lib/modules/$m; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 rootfs /newroot || {
  echo "KVCONFORM-VM-FAIL no root share"; exec sh; }
mount --move /dev /newroot/dev
exec switch_root /newroot /kvconform-init
"""

# The root's init (PID 1): writable scratch, the shares, both RDMA devices, then /mnt/run/cmd.sh with its
# exit status as a console marker; powers off at the end so qemu exits by itself.
VM_INIT = """#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
mount -t proc proc /proc
mount -t sysfs sys /sys
for d in /tmp /run /var/tmp /root; do mount -t tmpfs tmpfs $d; done
o=trans=virtio,version=9p2000.L,msize=262144
mount -t 9p -o $o,ro project /mnt/project
mount -t 9p -o $o,ro pydeps /mnt/pydeps
mount -t 9p -o $o run /mnt/run
ip link set lo up
# rdma_cm refuses 127.0.0.1: siw0 sits on a dummy netdev whose address exists only inside this VM.
ip link add kvc0 type dummy && ip addr add 10.77.0.1/24 dev kvc0 && ip link set kvc0 up
modprobe rdma_rxe && modprobe siw && modprobe rdma_ucm
# rdma_cm gives an iWARP connection a random local port without asking TCP; siw's connect to a peer whose 4-tuple
# with that port is still in TIME_WAIT fails (EADDRNOTAVAIL) unless TCP may take the tuple over
sysctl -qw net.ipv4.tcp_tw_reuse=1
rdma link add rxe0 type rxe netdev lo
rdma link add siw0 type siw netdev kvc0
echo "KVCONFORM-VM-READY"
# the project is not installed in the guest: tools/checkout-site maps the package's folders (pyproject package-dir)
export PYTHONPATH=/mnt/project/tools/checkout-site:/mnt/project:/mnt/pydeps
export KVCONFORM_VM_RUN=/mnt/run KVCONFORM_VM_SIW_ADDR=10.77.0.1
cd /mnt/project
if [ -f /mnt/run/cmd.sh ]; then sh /mnt/run/cmd.sh < /dev/null 2>&1; rc=$?; else rc=127; fi
echo "$rc" > /mnt/run/exit_status
sync
echo "KVCONFORM-VM-EXIT $rc"
# sysrq power-off is asynchronous: give it a bounded moment (exiting PID 1 panics, and panic=-1 with qemu's
# -no-reboot ends the VM as well).
echo o > /proc/sysrq-trigger
sleep 5
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="testbeds/rdma-vm/build", description=__doc__.splitlines()[0])
    p.add_argument("--cache", type=Path, default=None, help=f"cache root (default ${CACHE_ENV} or ~/.cache/...)")
    p.add_argument("--rebuild", action="store_true", help="build even when the cache has the entry")
    args = p.parse_args(argv)
    art = ensure(args.cache, rebuild=args.rebuild)
    print(art.dir)
    return 0


def manifest(art: Artefacts) -> Mapping[str, object]:
    return dict(json.loads(art.manifest.read_text()))


if __name__ == "__main__":
    raise SystemExit(main())
