"""How a cell reaches its participants: registry run forms -> the harness's own drivers.

A role's run form becomes the ``TargetSpec`` the role's driver takes (``kvconform.targets.registry``), so a
cell drives a publisher, consumer, prefill side, decode side, writer, reader, initiator or target exactly as
its conformance suite does. Two things the drivers do not do live here:

- **Relays** the harness starts (``cmd:``): ``start_relay`` picks a free UDP port of 127.0.0.1, starts the
  command through the one process driver (``kvconform.targets.process``) and waits, bounded, for its
  readiness (a log line and/or the port bound); ``url:`` relays are used as they are, reference and
  ``python:`` relays run in-process with an open policy.
- **Images under the container contract** (``image:``, docs/docker-contract.md): the role is played as
  ``--target docker:IMAGE`` plays it (``kvconform.targets.docker``: ``contract_driver``, ``ContainerRelay``), the
  registry's ``contract:`` parameters as the target's ``params.docker``, every container labelled with the cell
  and the matrix run (``remove_containers`` finds them). A role the image declares it does not play (exit 127
  and ``kvconform-unsupported``) makes the cell inconclusive (``declared_unsupported``), never a pass.
- **Docker**: a ``cmd:`` with ``docker: {image}`` runs as ``docker run --rm --network host`` of that image
  (127.0.0.1 only, never the bridge; labelled like every container of ``kvconform.targets.docker``), with the
  cell's folder mounted at the same path so file placeholders mean the same inside. The image is made by
  ``targets.docker.ensure_image`` (built from the registry's recipe when missing); no docker at all is
  ``TargetUnavailable`` (the cell is inconclusive). ``remove_containers`` removes what a cell left running.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvconform.matrix.registry import RunForm
from kvconform.moqt.tls import test_certificate
from kvconform.targets import docker as dk
from kvconform.targets.docker import unsupported_declaration
from kvconform.targets.drivers import driver_for
from kvconform.targets.process import Process, ProcessResult, fill_template
from kvconform.targets.spec import TargetSpec, _url_params
from kvconform.verdicts import TargetUnavailable

__all__ = ["CELL_LABEL", "READY_TIMEOUT_S", "RUN_LABEL", "Relay", "contract_params", "declared_unsupported",
           "docker_template", "remove_containers", "start_relay", "target_spec", "write_certificates"]

LOOPBACK = "127.0.0.1"
CELL_LABEL = "org.kvconform.matrix.cell"
RUN_LABEL = "org.kvconform.matrix.run"  # one value per `kvconform matrix` run: what it must remove at its end
READY_TIMEOUT_S = 30.0
READY_POLL_S = 0.05  # the output file and the port have no event to wait on: a short, bounded poll


def write_certificates(folder: Path) -> Path:
    """The harness's self-signed test certificate as ``cert.pem`` + ``priv.key`` in ``folder`` ({certs})."""

    cert = test_certificate()
    folder.mkdir(parents=True, exist_ok=True)
    for name, pem in (("cert.pem", cert.certificate_pem), ("priv.key", cert.private_key_pem)):
        path = folder / name
        path.write_bytes(pem)
        path.chmod(0o644)  # a container's user reads them through the bind mount
    return folder


def docker_template(form: RunForm, mounts: list[Path], cell: str, registry_dir: Path, run: str = "") -> str:
    """The ``cmd:`` template that runs ``form``'s command inside its docker image (host network, the given
    folders mounted at the same paths, labelled with the cell and the matrix run), after making sure the image
    exists; TargetUnavailable otherwise."""

    assert form.docker is not None
    image = str(form.docker["image"])
    build = form.docker.get("build")
    spec = None
    if build:
        spec = dk.BuildSpec(context=(registry_dir / build["context"]).resolve(),
                            dockerfile=build.get("dockerfile", "Dockerfile"),
                            buildargs=dict(build.get("buildargs", {})),
                            timeout_s=float(build.get("timeout_s", 600)))
    client = dk.docker_client(timeout_s=30.0)  # DockerUnavailable (a TargetUnavailable) without SDK or daemon
    try:
        dk.ensure_image(client, image, spec)
    finally:
        client.close()
    # No --name: a suite runs one container after another, and a name could still be taken by the last one.
    prefix = ["docker", "run", "--rm", "--network", "host", "--label", f"{dk.HARNESS_LABEL}=1",
              "--label", f"{dk.OWNER_LABEL}={os.getpid()}", "--label", f"{CELL_LABEL}={cell}",
              "--label", f"{RUN_LABEL}={run}"]
    for folder in mounts:
        prefix += ["-v", f"{folder}:{folder}"]
    return shlex.join([*prefix, image]) + " " + form.value


def contract_params(form: RunForm, registry_dir: Path, cell: str, run: str) -> dict[str, Any]:
    """The ``params.docker`` of an ``image:`` form: its ``contract:`` parameters (build paths made absolute from
    the registry's folder) and the labels naming the cell and the matrix run."""
    params = dict(form.contract or {})
    build = params.get("build")
    if build:
        params["build"] = {**build, **{key: str((registry_dir / build[key]).resolve())
                                       for key in ("context", "script") if key in build}}
    params["labels"] = {CELL_LABEL: cell, RUN_LABEL: run}
    return params


def declared_unsupported(participants: Mapping[str, Any]) -> tuple[str, str] | None:
    """(suite, why) of the first ``image:`` participant whose image declared, in this process, that it does not
    play its role (exit 127 with ``kvconform-unsupported``), or None. ``participants``: suite -> anything with a
    ``run`` RunForm."""

    for suite, participant in participants.items():
        form: RunForm = participant.run
        if form.kind == "image":
            why = unsupported_declaration(form.value, suite)
            if why is not None:
                return suite, why
    return None


def remove_containers(run: str, cell: str | None = None) -> list[str]:
    """Remove every container of the matrix run ``run`` (of its cell or suite ``cell`` when given) that is
    still there (its ``docker run`` was killed, or SIGTERM did not stop it); their names. Only that run's:
    another matrix run on the machine may have cells of the same names."""

    if dk.docker_problem() is not None:
        return []
    labels = [f"{RUN_LABEL}={run}", *([f"{CELL_LABEL}={cell}"] if cell is not None else [])]
    client = dk.docker_client(timeout_s=30.0)
    removed: list[str] = []
    try:
        for container in client.containers.list(all=True, filters={"label": labels}):
            with contextlib.suppress(Exception):
                container.remove(force=True)
                removed.append(str(container.name))
    finally:
        client.close()
    return removed


def target_spec(name: str, suite: str, form: RunForm, pics: dict[str, Any], *, mounts: list[Path] | None = None,
                cell: str = "", registry_dir: Path | None = None, run: str = "") -> TargetSpec:
    """The TargetSpec the role's driver takes for ``form``: an ``image:`` a ``docker`` target (the contract), a
    ``cmd:`` inside ``docker:`` its ``docker run`` template."""

    source = f"implementations registry: {name} ({suite})"
    if form.kind == "reference":
        return TargetSpec(name, "reference", "reference", {suite}, dict(pics), {}, source)
    if form.kind == "python":
        return TargetSpec(name, "python", form.value, {suite}, dict(pics), {}, source)
    if form.kind == "url":
        return TargetSpec(name, "url", form.value, {suite}, dict(pics), _url_params(form.value), source)
    if form.kind == "image":
        params = contract_params(form, registry_dir or Path.cwd(), cell, run)
        return TargetSpec(name, "docker", form.value, {suite}, dict(pics), {"docker": params}, source)
    template = form.value
    if form.docker:
        template = docker_template(form, mounts or [], cell, registry_dir or Path.cwd(), run)
    return TargetSpec(name, "cmd", template, {suite}, dict(pics), {}, source)


# ---- relays the harness starts -------------------------------------------------------------------------


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _udp_bound(port: int) -> bool:
    # A QUIC server ignores junk: with host networking the port is ready when we can no longer bind it.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return True
    return False


def _tcp_open(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class Relay:
    """A relay a cell uses: its URL and, when the harness started it, how to stop it."""

    url: str
    process: Process | None = None
    driver: Any = None  # a RelayDriver: in-process, or a ContainerRelay (an image: relay)
    argv: list[str] | None = None
    result: ProcessResult | None = None

    def alive(self) -> bool:
        """False once a relay the harness started has exited (it must serve until stopped)."""
        return self.process is None or self.process.running()

    def stop(self) -> ProcessResult | None:
        if self.process is not None and self.result is None:
            self.result = self.process.stop()
        if self.driver is not None:
            self.driver.stop()
            self.result = getattr(self.driver, "result", None)  # a ContainerRelay's container: its output
            self.driver = None
        return self.result


def _wait_ready(proc: Process, ready: dict[str, Any], port: int, what: str) -> None:
    timeout = float(ready.get("timeout_s", READY_TIMEOUT_S))
    pattern = ready.get("log")
    regex = re.compile(str(pattern).replace("{port}", str(port)), re.MULTILINE) if pattern else None
    probe = ready.get("probe", "udp-bound" if regex is None else None)
    deadline = time.monotonic() + timeout
    seen_log = regex is None
    while True:
        if not seen_log:
            out, err = proc.output()
            seen_log = bool(regex and (regex.search(out.decode("utf-8", "replace"))
                                       or regex.search(err.decode("utf-8", "replace"))))
        probed = probe is None or (_udp_bound(port) if probe == "udp-bound" else _tcp_open(port))
        if seen_log and probed:
            return
        if not proc.running():
            result = proc.stop()
            raise TargetUnavailable(f"the {what} exited {result.returncode} before it was ready on port {port}; "
                                    f"stdout: {result.stdout_text[-1500:]!r} stderr: {result.stderr_text[-1500:]!r}")
        if time.monotonic() >= deadline:
            result = proc.stop()
            missing = [m for m, ok in ((f"a line matching {pattern!r}", seen_log), (f"{probe} probe", probed))
                       if not ok]
            raise TargetUnavailable(f"the {what} was not ready on port {port} within {timeout:g} s (no "
                                    f"{' and no '.join(missing)}); stdout: {result.stdout_text[-1500:]!r} "
                                    f"stderr: {result.stderr_text[-1500:]!r}")
        proc.wait(READY_POLL_S)


def start_relay(spec: TargetSpec, ready: dict[str, Any], certs: Path, *,
                env: Mapping[str, str] | None = None) -> Relay:
    """Start (or locate) the relay ``spec`` names (a ``cmd:`` one with ``env``, default this process's);
    TargetUnavailable when it cannot be started or is not ready."""
    if spec.kind == "url":
        return Relay(spec.value)
    if spec.kind in ("reference", "python", "docker"):
        # docker: a ContainerRelay (the contract: the policy file, the certificate, a free port, readiness)
        driver = driver_for("kvcs-relay", spec)
        url = driver.start({"version": 1, "allow_all": True})  # every cell's scope is new: an open policy
        return Relay(str(url), driver=driver)
    port = _free_udp_port()
    argv = fill_template(spec.value, {"port": str(port), "certs": str(certs)})
    proc = Process(argv, env=env, what="relay")
    proc.start()
    try:
        _wait_ready(proc, ready, port, "relay")
    except BaseException:
        proc.stop()
        raise
    return Relay(f"moqt://{LOOPBACK}:{port}", proc, argv=argv)
