"""Unit-level parts of the RDMA testbed VM (issue 13 §1): cache keys, the kernel/initramfs helpers, the driver.

The driver runs against a fake ``qemu`` (a script that plays the VM's init: runs cmd.sh from the run share and
prints the markers), so the bound, the streaming and the always-stop guarantees are tested without a VM. The
real VM run is ``.ci/rdma``.
"""

from __future__ import annotations

import gzip
import lzma
import os
import shutil
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kvconform.targets.testbed import TestbedError, load_testbed
from kvconform.testbeds.rdma_vm import build, smoke, vm
from kvconform.testbeds.rdma_vm.build import Artefacts, Versions, extract_vmlinux, module_load_order

REPO = Path(__file__).resolve().parents[1]

FAKE_QEMU = textwrap.dedent("""\
    import os, subprocess, sys
    args = sys.argv[1:]
    run = project = None
    for i, a in enumerate(args):
        if a == "-fsdev":
            opts = dict(o.split("=", 1) for o in args[i + 1].split(",")[1:])
            tag_dev = args[args.index(args[i + 1]) + 2]
            tag = tag_dev.rsplit("mount_tag=", 1)[1]
            if tag == "run":
                run = opts["path"]
            elif tag == "project":
                project = opts["path"]
    open(os.path.join(run, "qemu.pid"), "w").write(str(os.getpid()))
    print("fake kernel booting", flush=True)
    print("KVCONFORM-VM-READY", flush=True)
    env = dict(os.environ, KVCONFORM_VM_RUN=run)
    rc = subprocess.call(["sh", os.path.join(run, "cmd.sh")], cwd=project, env=env)
    open(os.path.join(run, "exit_status"), "w").write(str(rc))
    print(f"KVCONFORM-VM-EXIT {rc}", flush=True)
""")


@pytest.fixture
def fake(tmp_path: Path) -> tuple[Artefacts, str]:
    qemu = tmp_path / "qemu-system-x86_64"
    qemu.write_text(f"#!{sys.executable}\n" + FAKE_QEMU)
    qemu.chmod(0o755)
    art = Artefacts(tmp_path / "cache" / "entry")
    (art.root).mkdir(parents=True)
    art.pydeps.mkdir()
    art.vmlinux.write_bytes(b"\x7fELF")
    art.initramfs.write_bytes(b"070701")
    art.manifest.write_text("{}")
    return art, str(qemu)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie not yet reaped by its parent counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_cache_key_changes_with_each_version() -> None:
    base = Versions(kernel_abi="6.1.0-57-amd64", kernel_package="6.1.192-3", rdma_core="44.0-2",
                    recipe=build.recipe_id(), pydeps="aa")
    assert base.key == Versions(**base.as_dict()).key
    changed = [Versions(**{**base.as_dict(), field: value}) for field, value in
               (("kernel_abi", "6.1.0-58-amd64"), ("kernel_package", "6.1.192-4"), ("rdma_core", "44.0-3"),
                ("recipe", "999"), ("pydeps", "bb"))]
    keys = {base.key, *(v.key for v in changed)}
    assert len(keys) == 6
    assert base.key.startswith("6.1.0-57-amd64-rdma44.0-2-r")


def test_recipe_id_follows_the_init_scripts(monkeypatch: pytest.MonkeyPatch) -> None:
    before = build.recipe_id()
    assert before.startswith(build.RECIPE_VERSION + ".")
    monkeypatch.setattr(build, "VM_INIT", build.VM_INIT + "# edited\n")
    assert build.recipe_id() != before


def test_cache_dir_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    assert build.default_cache_dir() == tmp_path
    monkeypatch.delenv(build.CACHE_ENV)
    assert build.default_cache_dir() == Path.home() / ".cache" / "kvconform" / "rdma-vm"


def test_extract_vmlinux_finds_the_elf_payload() -> None:
    elf = b"\x7fELF" + bytes(range(256)) * 8
    decoy = lzma.compress(b"not an elf", format=lzma.FORMAT_XZ)
    assert extract_vmlinux(b"MZ setup" + decoy + b"pad" + lzma.compress(elf, format=lzma.FORMAT_XZ)) == elf
    assert extract_vmlinux(b"MZ setup" + gzip.compress(elf)) == elf
    with pytest.raises(RuntimeError, match="no xz or gzip ELF payload"):
        extract_vmlinux(b"MZ" + gzip.compress(b"plain data"))


def test_module_load_order_puts_dependencies_first(tmp_path: Path) -> None:
    (tmp_path / "modules.dep").write_text(
        "kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/netfs/netfs.ko\n"
        "kernel/net/9p/9pnet_virtio.ko: kernel/net/9p/9pnet.ko\n"
        "kernel/net/9p/9pnet.ko:\nkernel/fs/netfs/netfs.ko:\nkernel/other.ko:\n")
    order = module_load_order(tmp_path, ("virtio_pci", "9pnet_virtio", "9p"))  # virtio_pci built in: skipped
    assert order == ["kernel/net/9p/9pnet.ko", "kernel/net/9p/9pnet_virtio.ko", "kernel/fs/netfs/netfs.ko",
                     "kernel/fs/9p/9p.ko"]


def test_run_streams_lines_and_brings_back_status_and_files(fake: tuple[Artefacts, str]) -> None:
    art, qemu = fake
    seen: list[str] = []
    cmd = 'echo hello; echo evidence > "$KVCONFORM_VM_RUN/results/e.txt"; echo bye; exit 3'
    with vm.VM(art, qemu=qemu) as machine:
        res = machine.run(cmd, timeout=20, on_line=seen.append)
        assert machine.proc is None
    assert seen == res.lines
    assert seen.index("hello") < seen.index("bye") < seen.index("KVCONFORM-VM-EXIT 3")
    assert res.exit_status == 3 and not res.timed_out and not res.ok
    assert res.boot_s is not None
    assert [p.name for p in res.files] == ["e.txt"] and res.files[0].read_text() == "evidence\n"
    machine.cleanup()
    assert not res.run_dir.exists()


# The second command outlives qemu's SIGTERM (ignored signals survive exec): stop() must still leave nothing.
@pytest.mark.parametrize("prelude", ["", "trap '' TERM; "], ids=["plain", "ignores-sigterm"])
def test_bound_kills_a_hanging_command_and_stops_the_vm(fake: tuple[Artefacts, str], prelude: str) -> None:
    art, qemu = fake
    started = time.monotonic()
    with vm.VM(art, qemu=qemu) as machine:
        res = machine.run(prelude + 'echo $$ > "$KVCONFORM_VM_RUN/child"; echo started; sleep 60', timeout=1.5)
    assert time.monotonic() - started < 10
    assert res.timed_out and res.exit_status is None and "started" in res.lines
    assert machine.proc is None
    assert _gone(int((res.run_dir / "qemu.pid").read_text()))
    assert _gone(int((res.run_dir / "child").read_text()))
    machine.cleanup()


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_vm_stopped_when_the_caller_raises(fake: tuple[Artefacts, str], exc: type[BaseException]) -> None:
    art, qemu = fake

    def boom(line: str) -> None:
        if line == "started":
            raise exc("caller gave up")

    machine = vm.VM(art, qemu=qemu)
    with pytest.raises(exc), machine:
        machine.run('echo started; sleep 60', timeout=20, on_line=boom)
    assert machine.proc is None
    assert _gone(int((machine.run_dir / "qemu.pid").read_text()))
    machine.cleanup()


def test_skip_reason_is_one_line(monkeypatch: pytest.MonkeyPatch, fake: tuple[Artefacts, str],
                                 tmp_path: Path) -> None:
    art, qemu = fake
    monkeypatch.delenv(vm.QEMU_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    no_qemu = vm.skip_reason(art.dir.parent)
    assert no_qemu is not None and "\n" not in no_qemu and "qemu-system-x86_64 not found" in no_qemu
    monkeypatch.setenv(vm.QEMU_ENV, qemu)
    no_image = vm.skip_reason(tmp_path / "empty-cache")
    assert no_image is not None and "\n" not in no_image and "no built VM image" in no_image
    assert vm.skip_reason(art.dir.parent) is None


def test_command_line_is_tcg_one_vcpu_pvh_with_the_shares(fake: tuple[Artefacts, str]) -> None:
    art, qemu = fake
    machine = vm.VM(art, qemu=qemu)
    argv = machine.command_line()
    assert argv[:7] == [qemu, "-accel", "tcg", "-cpu", "max", "-smp", "1"]
    assert argv[argv.index("-kernel") + 1] == str(art.vmlinux)
    tags = [a.rsplit("mount_tag=", 1)[1] for a in argv if "mount_tag=" in a]
    assert tags == ["rootfs", "project", "pydeps", "run"]
    ro = [a for a in argv if a.startswith("local,")]
    assert [("readonly=on" in a) for a in ro] == [True, True, True, False]
    machine.cleanup()


@pytest.mark.parametrize("name", ["rdma-vm.yaml", "rdma-hardware.example.yaml"])
def test_rdma_testbeds_validate(name: str) -> None:
    tb = load_testbed(REPO / "testbeds" / name)
    devices = {t["verbs"]["device"] for t in tb.targets.values() if t["driver"] == "verbs"}
    assert devices == ({"rxe0", "siw0"} if name == "rdma-vm.yaml" else {"mlx5_0"})


def test_verbs_target_needs_its_device(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ntargets:\n  nic: {driver: verbs, roles: [kbtp-target]}\n")
    with pytest.raises(TestbedError, match="verbs"):
        load_testbed(bad)
    bad.write_text("name: bad\ntargets:\n  nic: {driver: verbs, verbs: {port: 1}}\n")
    with pytest.raises(TestbedError, match="device"):
        load_testbed(bad)


def test_lane_skips_with_one_line_without_qemu_and_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(vm.QEMU_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("the lane must not build when it skips")

    monkeypatch.setattr(build, "ensure", no_build)
    assert smoke.main([]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("rdma-vm: skipped: ")


def test_root_keeps_the_rdma_modules_and_drops_other_drivers(tmp_path: Path) -> None:
    src = tmp_path / "src" / "modules" / "6.1.0-57-amd64"
    for rel in ("kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko", "kernel/drivers/net/dummy.ko",
                "kernel/drivers/net/ethernet/intel/e1000e.ko", "kernel/drivers/gpu/drm/drm.ko",
                "kernel/sound/core/snd.ko", "kernel/crypto/crc32c_generic.ko", "kernel/net/ipv4/udp_tunnel.ko"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(b"ko")
    dst = tmp_path / "dst"
    shutil.copytree(tmp_path / "src" / "modules", dst, ignore=build._skip_unneeded_drivers)
    kept = sorted(str(p.relative_to(dst / "6.1.0-57-amd64")) for p in dst.rglob("*.ko"))
    assert kept == ["kernel/crypto/crc32c_generic.ko", "kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko",
                    "kernel/drivers/net/dummy.ko", "kernel/net/ipv4/udp_tunnel.ko"]


def test_links_put_every_host_end_on_loopback() -> None:
    assert vm.Links().qemu_args() == ["-nic", "none"]
    args = " ".join(vm.Links(roce=(40001, 40002), forwards=((41001, 18515), (41002, 7471))).qemu_args())
    assert "socket,id=roce,udp=127.0.0.1:40001,localaddr=127.0.0.1:40002" in args
    assert f"mac={vm.ROCE_MAC}" in args and f"mac={vm.TCP_MAC}" in args
    assert "hostfwd=tcp:127.0.0.1:41001-10.0.2.15:18515,hostfwd=tcp:127.0.0.1:41002-10.0.2.15:7471" in args
    assert "hostfwd=tcp::" not in args and "0.0.0.0" not in args


def test_start_then_wait_for_a_line_while_the_command_runs(fake: tuple[Artefacts, str]) -> None:
    art, qemu = fake
    with vm.VM(art, qemu=qemu) as machine:
        machine.start('echo "SERVING port=7471"; sleep 60')
        m = machine.wait_for(r"SERVING port=(\d+)", 20)
        assert m[1] == "7471" and machine.proc is not None
        with pytest.raises(TimeoutError, match=r"0\.5 s passed before a line matching 'NEVER'"):
            machine.wait_for("NEVER", 0.5)
        res = machine.wait(0.5)  # the bound fires: stopped, reported as timed out
    assert res.timed_out and machine.proc is None and "SERVING port=7471" in res.lines
    machine.cleanup()


def test_wait_for_says_when_the_vm_ended_without_the_line(fake: tuple[Artefacts, str]) -> None:
    art, qemu = fake
    with vm.VM(art, qemu=qemu) as machine:
        machine.start("echo booted; exit 4")
        with pytest.raises(TimeoutError, match="the VM ended before a line matching 'READY-NOT'"):
            machine.wait_for("READY-NOT", 20)
        assert machine.wait(20).exit_status == 4
    machine.cleanup()


def test_the_ci_lane_skips_with_one_line_without_qemu_and_apt(tmp_path: Path) -> None:
    """`.ci/rdma` itself, as CI calls it, on a host with neither qemu nor apt-get on PATH."""
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname",):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    env = {"PATH": str(bin_dir), "PYTHON": sys.executable, "HOME": str(tmp_path)}
    proc = subprocess.run(["/bin/bash", str(REPO / ".ci" / "rdma")], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1 and proc.stdout.startswith("rdma-vm: skipped: "), proc.stdout
