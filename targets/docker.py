"""Docker driver: an implementation run as a container on the host's network, talking on 127.0.0.1 only.

Every container runs with ``network_mode="host"``: no port is ever published and the docker bridge (a
private address range tests must never send to) is never used, so a container is reached exactly like a local
process, on 127.0.0.1. Images are built locally when missing (see ``testbeds/docker/``): no registry.

Two layers. ``DockerContainer`` runs one container (bounded start, readiness, log follower, stop with SIGTERM
then SIGKILL, removal however the run ends, output kept as bytes). On it, ``ContainerLauncher`` plays a role
under the container contract (``targets/contract.py``, docs/docker-contract.md): it is the ``Launcher`` the
``cmd:`` drivers of every lane take (one container per export, import, prefill or fetch; one per decode side or
publisher), and ``ContainerRelay`` is the relay driver of ``moqt-relay`` / ``kvcs-relay``. ``contract_driver``
is what ``targets/registry.py`` calls for a ``docker:IMAGE`` target; ``play_role`` is the one call for anything else
(the plugfest matrix) that runs an image in a role: start, ready, logs into the evidence, removed.

The ``docker`` SDK is an optional dependency (extra ``docker``). Without it, or without a reachable
daemon, or when an image cannot be built, the driver raises :class:`DockerUnavailable`, a
``TargetUnavailable``: a setup problem (verdict inconclusive), never a verdict on the implementation.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import yaml

from kvconform import evidence
from kvconform.moqt.tls import test_certificate
from kvconform.targets import contract
from kvconform.targets.process import ProcessResult
from kvconform.targets.registry import ROLES, load_ref
from kvconform.targets.spec import TargetSpec, parse_target
from kvconform.targets.testbed import Testbed, load_testbed
from kvconform.verdicts import DriverError, TargetUnavailable, inconclusive

if TYPE_CHECKING:  # the SDK is optional at run time
    from docker import DockerClient
    from docker.models.containers import Container

__all__ = [
    "HARNESS_LABEL",
    "LOOPBACK",
    "OWNER_LABEL",
    "RECIPE_LABEL",
    "ROLE_LABEL",
    "BuildSpec",
    "ContainerLauncher",
    "ContainerRelay",
    "ContainerRun",
    "ContainerSpec",
    "DockerContainer",
    "DockerUnavailable",
    "Readiness",
    "RunResult",
    "build_spec",
    "contract_driver",
    "contract_spec",
    "docker_client",
    "docker_params",
    "docker_problem",
    "ensure_image",
    "free_port",
    "main",
    "play_role",
    "prepare_images",
    "reap_orphans",
    "recipe_digest",
    "run_to_completion",
    "running",
    "unsupported_declaration",
]

LOOPBACK = "127.0.0.1"
HARNESS_LABEL = "org.kvconform.harness"
OWNER_LABEL = "org.kvconform.pid"
ROLE_LABEL = "org.kvconform.role"
RECIPE_LABEL = "org.kvconform.recipe"  # recipe_digest() of the Dockerfile build an image was made from
STOP_TIMEOUT_S = 3  # seconds between SIGTERM and SIGKILL when a container is stopped (as targets/process.py)
READY_TIMEOUT_S = 30.0  # a server role's bound to become ready (as CmdDecode's)
ProbeKind = Literal["tcp", "udp-bound"]


class DockerUnavailable(TargetUnavailable):
    """Docker cannot be used here (no SDK, no daemon, image missing and not buildable)."""


@dataclass(frozen=True)
class BuildSpec:
    """How to build an image that is missing: a context folder, its Dockerfile and build args; or a script
    (run with bash, ``IMAGE`` in its environment) that builds it, for an image whose context must be made first
    (the reference image: a wheel of this checkout)."""

    context: Path
    dockerfile: str = "Dockerfile"
    buildargs: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0
    script: Path | None = None


@dataclass(frozen=True)
class Readiness:
    """When a started container counts as ready: a log line matching ``log_pattern`` and/or a probe of
    ``probe_port`` on 127.0.0.1 succeeding (both, or with ``any_of`` whichever comes first), within ``timeout_s``."""

    log_pattern: str | None = None
    probe: ProbeKind | None = None
    probe_port: int | None = None
    timeout_s: float = 30.0
    any_of: bool = False

    def __post_init__(self) -> None:
        if (self.probe is None) != (self.probe_port is None):
            raise ValueError("Readiness: probe and probe_port go together")


@dataclass(frozen=True)
class ContainerSpec:
    """A container to run: image, command (its ENTRYPOINT's arguments), environment, bind mounts (host ->
    container; read-only, ``writable`` ones read-write), the user it runs as (None: the image's), labels."""

    image: str
    command: Sequence[str]
    environment: Mapping[str, str] = field(default_factory=dict)
    mounts: Mapping[str, str] = field(default_factory=dict)
    name: str | None = None
    ready: Readiness = field(default_factory=Readiness)
    build: BuildSpec | None = None
    stop_timeout_s: int = 5
    writable: Mapping[str, str] = field(default_factory=dict)
    user: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    log_events: bool = True  # each output line also as a docker-log evidence event


@dataclass(frozen=True)
class RunResult:
    """A one-shot container's exit status and output."""

    exit_code: int
    stdout: str
    stderr: str


def docker_problem() -> str | None:
    """Why docker cannot be used here, or None when the SDK imports and the daemon answers a ping."""
    try:
        client = docker_client(timeout_s=5.0)
    except DockerUnavailable as exc:
        return str(exc)
    client.close()
    return None


def docker_client(timeout_s: float = 60.0) -> DockerClient:
    """A client of the local daemon (``DOCKER_HOST`` or the default socket); DockerUnavailable otherwise."""
    try:
        import docker  # optional: the docker extra
        from docker.errors import DockerException
    except ImportError as exc:
        raise DockerUnavailable(f"the docker SDK is not installed (pip install 'kvconform[docker]'): {exc}") from exc
    try:
        client = docker.from_env(timeout=int(timeout_s))
        client.ping()
    except DockerException as exc:
        raise DockerUnavailable(f"the docker daemon is not reachable: {exc}") from exc
    return client


def recipe_digest(build: BuildSpec) -> str:
    """SHA-256 of a Dockerfile build's recipe: every file of its context (path and content), the Dockerfile's
    name and the build args. An image labelled with another digest was built from another recipe."""
    digest = hashlib.sha256(f"{build.dockerfile}\0{sorted(build.buildargs.items())}\0".encode())
    for path in sorted(p for p in build.context.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(build.context)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def ensure_image(client: DockerClient, image: str, build: BuildSpec | None = None) -> str:
    """The id of ``image``, building it from ``build`` (host networking, no registry) when it is missing, or when
    it was built from another Dockerfile recipe than ``build`` (its ``org.kvconform.recipe`` label)."""
    from docker.errors import BuildError, DockerException, ImageNotFound  # optional: the docker extra

    digest = recipe_digest(build) if build is not None and build.script is None and build.context.is_dir() else None
    try:
        found = client.images.get(image)
        if digest is None or (found.labels or {}).get(RECIPE_LABEL) == digest:
            return str(found.id)
        evidence.note(f"docker: {image} was built from another recipe than {build.context if build else '?'}; "
                      "rebuilding")
    except ImageNotFound:
        if build is None:
            raise DockerUnavailable(f"image {image!r} is not present and no build recipe was given") from None
    except DockerException as exc:
        raise DockerUnavailable(f"cannot inspect image {image!r}: {exc}") from exc
    assert build is not None
    if build.script is not None:
        return _build_by_script(client, image, build)
    if not (build.context / build.dockerfile).is_file():
        raise DockerUnavailable(f"image {image!r}: no Dockerfile at {build.context / build.dockerfile}")
    evidence.note(f"docker: building {image} from {build.context}/{build.dockerfile}")
    # A client of its own: the build's bound is the HTTP read timeout of that call.
    builder = docker_client(timeout_s=build.timeout_s)
    try:
        built, _log = builder.images.build(
            path=str(build.context), dockerfile=build.dockerfile, tag=image, buildargs=dict(build.buildargs),
            network_mode="host", rm=True, forcerm=True, pull=False, labels={RECIPE_LABEL: digest or ""},
        )
    except (BuildError, DockerException) as exc:
        raise DockerUnavailable(f"building image {image!r} from {build.context} failed: {exc}") from exc
    finally:
        builder.close()
    return str(built.id)


def _script_env(image: str) -> dict[str, str]:
    """An image's build script runs with IMAGE, and PYTHON: this interpreter, which imports kvconform (the scripts
    ask it for the machine's Debian mirror, kvconform.testbeds.apt_mirror)."""
    return {**os.environ, "PYTHON": sys.executable, "IMAGE": image}


def _build_by_script(client: DockerClient, image: str, build: BuildSpec) -> str:
    assert build.script is not None
    evidence.note(f"docker: building {image} with {build.script}")
    try:
        subprocess.run(["bash", str(build.script)], check=True, timeout=build.timeout_s, stdin=subprocess.DEVNULL,
                       env=_script_env(image), capture_output=True)
    except subprocess.CalledProcessError as exc:
        tail = (exc.stdout + exc.stderr).decode("utf-8", "replace")[-2000:]
        raise DockerUnavailable(f"image {image!r}: {build.script} exited {exc.returncode}: {tail}") from exc
    except (subprocess.SubprocessError, OSError) as exc:
        raise DockerUnavailable(f"image {image!r}: {build.script} failed: {exc}") from exc
    try:
        return str(client.images.get(image).id)
    except Exception as exc:  # ImageNotFound or the daemon going away
        raise DockerUnavailable(f"image {image!r}: {build.script} succeeded but made no such image") from exc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_orphans(client: DockerClient) -> list[str]:
    """Remove harness containers whose owning process is gone (a run killed before its cleanup); the
    names removed. Containers of live runs, and containers without the owner label, are left alone."""
    from docker.errors import DockerException  # optional: the docker extra

    removed: list[str] = []
    for container in client.containers.list(all=True, filters={"label": HARNESS_LABEL}):
        owner = (container.labels or {}).get(OWNER_LABEL, "")
        if owner.isdigit() and not _alive(int(owner)):
            with contextlib.suppress(DockerException):
                container.remove(force=True)
                removed.append(str(container.name))
    if removed:
        evidence.note(f"docker: removed containers left by killed runs: {removed}")
    return removed


def free_port(kind: Literal["udp", "tcp"] = "udp") -> int:
    """A port on 127.0.0.1 that is free now (the kernel's choice), for a peer's command line."""
    sock_type = socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM
    with socket.socket(socket.AF_INET, sock_type) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _probe(kind: ProbeKind, port: int) -> bool:
    if kind == "tcp":
        try:
            with socket.create_connection((LOOPBACK, port), timeout=0.5):
                return True
        except OSError:
            return False
    # UDP has no handshake to probe (a QUIC server ignores junk): with host networking, the port is ready
    # when we can no longer bind it ourselves.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def _run_kwargs(spec: ContainerSpec) -> dict[str, Any]:
    """The only way containers are created here: host network, nothing published, mounts read-only unless
    listed writable, a name of its own (so a container whose start failed can still be found and removed)."""
    volumes = {host: {"bind": inside, "mode": "ro"} for host, inside in spec.mounts.items()}
    volumes.update({host: {"bind": inside, "mode": "rw"} for host, inside in spec.writable.items()})
    kwargs: dict[str, Any] = {
        "command": list(spec.command),
        "environment": dict(spec.environment),
        "network_mode": "host",
        "volumes": volumes,
        "detach": True,
        # The owner's pid lets a later run remove what a killed run left behind (reap_orphans).
        "labels": {**spec.labels, HARNESS_LABEL: "1", OWNER_LABEL: str(os.getpid())},
        "name": spec.name or f"kvconform-{uuid.uuid4().hex[:12]}",
    }
    if spec.user is not None:
        kwargs["user"] = spec.user
    return kwargs


# Containers this process has started and not yet removed: removed at interpreter exit too (a run ended by
# an exception nobody caught); a run killed outright leaves them to the next run's reap_orphans.
_LIVE: set[DockerContainer] = set()
_LIVE_LOCK = threading.Lock()


@atexit.register
def _remove_live() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for container in live:
        with contextlib.suppress(Exception):
            container.close()


def _create(client: DockerClient, spec: ContainerSpec) -> Container:
    """``containers.run`` (create, then start); a container created but not started is removed again, by its name,
    and so is one whose create a Ctrl-C cut off before the daemon's answer came (nothing holds a handle to it)."""
    from docker.errors import DockerException  # optional: the docker extra

    kwargs = _run_kwargs(spec)
    try:
        container: Container = client.containers.run(spec.image, **kwargs)
    except BaseException as exc:
        with contextlib.suppress(DockerException):
            client.containers.get(kwargs["name"]).remove(force=True)
        if isinstance(exc, DockerException):
            raise DockerUnavailable(f"cannot start a container of {spec.image!r}: {exc}") from exc
        raise
    return container


class DockerContainer:
    """A running container with a log follower; a context manager that stops and removes it.

    After ``close()``: ``exit_code`` (None when it had to be killed or was never started), ``stdout`` and
    ``stderr`` (bytes, everything it wrote) and ``note`` (what the harness had to do, e.g. SIGKILL)."""

    def __init__(self, spec: ContainerSpec, client: DockerClient | None = None) -> None:
        self.spec = spec
        self._own_client = client is None
        self._client = client
        self._container: Container | None = None
        self.lines: list[str] = []
        self._lines_lock = threading.Lock()
        self._new_line = threading.Condition(self._lines_lock)
        self._follower: threading.Thread | None = None
        self._log_ended = False
        self.image_id = ""
        self.exit_code: int | None = None
        self.stdout = b""
        self.stderr = b""
        self.note = ""

    # -- lifecycle ----------------------------------------------------------------------------------

    def __enter__(self) -> DockerContainer:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    @property
    def client(self) -> DockerClient:
        if self._client is None:
            self._client = docker_client()
        return self._client

    @property
    def id(self) -> str:
        return str(self._container.id) if self._container is not None else ""

    def start(self, *, wait: bool = True) -> DockerContainer:
        """Ensure the image, run the container, follow its output and (with ``wait``) wait until it is ready; a
        container that does not get ready is stopped and removed before TargetUnavailable is raised."""
        self.image_id = ensure_image(self.client, self.spec.image, self.spec.build)
        evidence.record("sent", "docker-run", {"image": self.spec.image, "image_id": self.image_id,
                                                "command": list(self.spec.command),
                                                "environment": dict(self.spec.environment),
                                                "mounts": {**self.spec.mounts, **self.spec.writable},
                                                "user": self.spec.user, "network": "host",
                                                "labels": dict(self.spec.labels)})
        try:
            with _LIVE_LOCK:
                _LIVE.add(self)
            self._container = _create(self.client, self.spec)
            self._follower = threading.Thread(target=self._follow, name=f"docker-log-{self.id[:12]}", daemon=True)
            self._follower.start()
            if wait:
                self.wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop (SIGTERM, SIGKILL after ``stop_timeout_s``), keep its exit status and output, remove the
        container, then end the log follower; idempotent, bounded, and quiet when the daemon is gone."""
        from docker.errors import DockerException  # optional: the docker extra

        container, self._container = self._container, None
        if container is not None:
            stopped = time.monotonic()
            with contextlib.suppress(DockerException):
                container.stop(timeout=self.spec.stop_timeout_s)
            with contextlib.suppress(DockerException):
                container.reload()
                state = container.attrs.get("State", {})
                code = state.get("ExitCode")
                self.exit_code = int(code) if isinstance(code, int) else None
                if code == 137 and time.monotonic() - stopped >= self.spec.stop_timeout_s:
                    self.note = f"ignored SIGTERM for {self.spec.stop_timeout_s} s; killed"
                    self.exit_code = None
            with contextlib.suppress(DockerException):
                self.stdout = bytes(container.logs(stdout=True, stderr=False))
                self.stderr = bytes(container.logs(stdout=False, stderr=True))
            try:
                container.remove(force=True)
            except DockerException as exc:  # NotFound: already gone; anything else is worth saying
                if "No such container" not in str(exc):
                    self.note = (self.note + "; " if self.note else "") + f"remove failed: {exc}"
            evidence.record("note", "docker-stopped", {"image": self.spec.image, "id": str(container.id)[:12],
                                                       "exit_code": self.exit_code, "note": self.note})
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if self._follower is not None:
            self._follower.join(timeout=5.0)
            self._follower = None
        if self._own_client and self._client is not None:
            self._client.close()
            self._client = None

    # -- output ---------------------------------------------------------------------------------------

    def _follow(self) -> None:
        container = self._container
        assert container is not None
        pending = b""
        try:
            for chunk in container.logs(stream=True, follow=True, stdout=True, stderr=True):
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    self._add_line(raw.decode("utf-8", "replace"))
            if pending:
                self._add_line(pending.decode("utf-8", "replace"))
        except Exception as exc:  # the daemon went away or the container was removed: end of output
            self._add_line(f"[kvconform: log stream ended: {exc}]")
        finally:
            with self._new_line:
                self._log_ended = True
                self._new_line.notify_all()

    def _add_line(self, line: str) -> None:
        if self.spec.log_events:
            # A note, not "received": what a container logs is no protocol exchange with it (a server that printed
            # a banner and never listened exchanged nothing, and is inconclusive, not a failure).
            evidence.record("note", "docker-log", {"container": self.id[:12], "line": line})
        with self._new_line:
            self.lines.append(line)
            self._new_line.notify_all()

    def output(self) -> str:
        """Everything the container printed so far (stdout and stderr interleaved)."""
        with self._lines_lock:
            return "\n".join(self.lines)

    def wait_for_line(self, pattern: str, timeout_s: float) -> str:
        """The first output line matching ``pattern``; DriverError when none comes within ``timeout_s``."""
        regex = re.compile(pattern)
        line = self.wait_for(lambda text: regex.search(text) is not None, timeout_s)
        if line is None:
            with self._lines_lock:
                last = self.lines[-10:]
            raise DriverError(f"container {self.spec.image}: no output line matching {pattern!r} within "
                              f"{timeout_s} s; last lines: {last!r}")
        return line

    def wait_for(self, matches: Callable[[str], bool], timeout_s: float) -> str | None:
        """The first output line ``matches`` accepts, or None once the output ended or ``timeout_s`` passed."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        with self._new_line:
            while True:
                for line in self.lines[seen:]:
                    if matches(line):
                        return line
                seen = len(self.lines)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._log_ended:
                    return None
                self._new_line.wait(remaining)

    @property
    def output_ended(self) -> bool:
        """The log stream ended: the container exited (or the daemon went away)."""
        with self._lines_lock:
            return self._log_ended

    def status(self) -> str:
        """The container's state as docker reports it (running, exited, ...)."""
        if self._container is None:
            return "removed"
        self._container.reload()
        return str(self._container.status)

    def wait_exit(self, timeout_s: float) -> int | None:
        """Its exit status once it has exited, or None while it still runs after ``timeout_s``."""
        if self._container is None:
            return self.exit_code
        try:
            status = self._container.wait(timeout=max(timeout_s, 0.001))
        except Exception:  # requests' ReadTimeout / ConnectionError: still running at the bound
            return None
        return int(status.get("StatusCode", -1))

    def wait_ready(self) -> None:
        """Wait (bounded by the spec's readiness timeout) for the log line and the port probe (both, or the
        first of them with ``any_of``); TargetUnavailable when it does not get ready."""
        ready = self.spec.ready
        outcome = self.await_ready()
        if outcome != "ready":
            raise TargetUnavailable(
                f"container of {self.spec.image} ({' '.join(self.spec.command)}) not ready within "
                f"{ready.timeout_s} s: {outcome}; status {self.status()}; output:\n{self.output()[-4000:]}")
        evidence.note(f"docker: {self.spec.image} ready ({self.id[:12]})")

    def await_ready(self) -> str:
        """``"ready"``, or why not: ``"exited (...)"`` (its output ended first) or what it did not do in time."""
        ready = self.spec.ready
        regex = re.compile(ready.log_pattern) if ready.log_pattern is not None else None
        deadline = time.monotonic() + ready.timeout_s
        line_seen, probed, seen = False, False, 0
        while True:
            with self._lines_lock:
                new, seen, ended = self.lines[seen:], len(self.lines), self._log_ended
            line_seen = line_seen or (regex is not None and any(regex.search(line) for line in new))
            if ready.probe is not None and ready.probe_port is not None and not probed:
                probed = _probe(ready.probe, ready.probe_port)
            wanted = [done for done, asked in ((line_seen, regex is not None), (probed, ready.probe is not None))
                      if asked]
            if (all(wanted) if not ready.any_of else any(wanted) or not wanted):
                return "ready"
            missing = [what for what, done, asked in (
                (f"no line matching {ready.log_pattern!r}", line_seen, regex is not None),
                (f"{ready.probe} probe of 127.0.0.1:{ready.probe_port} failed", probed, ready.probe is not None))
                if asked and not done]
            if ended:
                return "exited (" + " and ".join(missing) + ")"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return " and ".join(missing)
            # A port being bound is no event to wait on: poll it every 50 ms; otherwise wait for a new line.
            with self._new_line:
                if len(self.lines) == seen and not self._log_ended:
                    self._new_line.wait(min(remaining, 0.05) if ready.probe is not None else remaining)


def run_to_completion(spec: ContainerSpec, timeout_s: float, client: DockerClient | None = None) -> RunResult:
    """Run a one-shot container (e.g. a peer's test client) to its end, bounded by ``timeout_s``; the
    container is removed afterwards. A container still running at the bound is killed: DriverError."""
    from docker.errors import DockerException  # optional: the docker extra

    own = client is None
    client = client or docker_client()
    try:
        ensure_image(client, spec.image, spec.build)
        evidence.record("sent", "docker-run", {"image": spec.image, "command": list(spec.command),
                                                "environment": dict(spec.environment), "network": "host"})
        container = _create(client, spec)
        try:
            try:
                status = container.wait(timeout=timeout_s)
            except Exception as exc:  # requests' ReadTimeout or a connection error: the bound was hit
                with contextlib.suppress(DockerException):
                    container.kill()
                raise DriverError(f"container {spec.image} {list(spec.command)} still running after "
                                  f"{timeout_s} s; killed") from exc
            stdout = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
            stderr = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
        finally:
            with contextlib.suppress(DockerException):
                container.remove(force=True)
        code = int(status.get("StatusCode", -1))
        evidence.record("received", "docker-exit", {"image": spec.image, "exit_code": code,
                                                    "stdout": stdout[-8000:], "stderr": stderr[-8000:]})
        return RunResult(code, stdout, stderr)
    finally:
        if own:
            client.close()


@contextlib.contextmanager
def running(spec: ContainerSpec, client: DockerClient | None = None) -> Iterator[DockerContainer]:
    """``with running(spec) as c:`` — a started, ready container, stopped and removed on exit."""
    container = DockerContainer(spec, client)
    container.start()
    try:
        yield container
    finally:
        container.close()


# ---- the container contract: a role played by an image ----------------------------------------------

# (image, role) -> why: what an image declared it does not play (exit 127 + kvconform-unsupported), so that the
# checks after the first need not start it again to hear the same.
_UNSUPPORTED: dict[tuple[str, str], str] = {}
_REAPED = False


def docker_params(target: TargetSpec, testbed: Testbed | None = None) -> dict[str, Any]:
    """The target's ``params.docker`` over the testbed's ``defaults.params.docker`` (a ``docker`` target parsed
    by ``parse_target`` has them merged already)."""
    merged: dict[str, Any] = dict(testbed.defaults.get("params", {}).get("docker", {})) if testbed else {}
    merged.update(target.params.get("docker", {}))
    return merged


def build_spec(params: Mapping[str, Any], testbed: Testbed | None = None) -> BuildSpec | None:
    """The BuildSpec of ``params.docker.build`` (relative paths from the testbed file's folder)."""
    build = params.get("build")
    if not build:
        return None
    root = Path(testbed.path).resolve().parent if testbed is not None else Path.cwd()
    script = build.get("script")
    return BuildSpec(context=root / build.get("context", "."), dockerfile=build.get("dockerfile", "Dockerfile"),
                     buildargs=dict(build.get("buildargs", {})), timeout_s=float(build.get("timeout_s", 600)),
                     script=root / script if script else None)


def contract_spec(image: str, role: str, values: Mapping[str, str], params: Mapping[str, Any] | None = None,
                  testbed: Testbed | None = None) -> ContainerSpec:
    """The container that asks ``image`` to play ``role`` with these placeholder values, under the contract
    (targets/contract.py): arguments, KVCONFORM_* environment, the folders of its files mounted read-write
    under /kvconform, the harness's uid:gid, readiness by the kvconform-ready line or the role's port probe.
    ``params`` are the target's ``params.docker`` (build, environment, user, ready_timeout_s, stop_timeout_s,
    labels)."""
    params = params or {}
    spec_role = contract.container_role(role)
    try:
        call = contract.invocation(role, values)
    except ValueError as exc:
        raise DockerUnavailable(f"image {image}: {exc} ({contract.item('invocation')})") from exc
    port = values.get("port")
    probe = spec_role.probe if spec_role.kind == "server" and port else None
    readiness = Readiness(log_pattern=r"^kvconform-ready\b" if spec_role.kind == "server" else None,
                          probe=probe, probe_port=int(port) if probe and port else None,
                          timeout_s=float(params.get("ready_timeout_s", READY_TIMEOUT_S)), any_of=True)
    user = params.get("user", f"{os.getuid()}:{os.getgid()}")
    return ContainerSpec(
        image=image, command=call.command,
        environment={**{str(k): str(v) for k, v in params.get("environment", {}).items()}, **call.environment},
        writable=call.mounts, ready=readiness, build=build_spec(params, testbed),
        stop_timeout_s=int(params.get("stop_timeout_s", STOP_TIMEOUT_S)), user=None if user == "image" else user,
        # A long-lived role's lines go to the evidence of the check running when it prints them; a one-shot
        # run's output is recorded whole by its driver.
        # params labels: a caller's own (the plugfest matrix labels its run's and cell's containers)
        labels={**{str(k): str(v) for k, v in params.get("labels", {}).items()}, ROLE_LABEL: role},
        log_events=spec_role.kind != "one-shot",
        name=f"kvconform-{role}-{uuid.uuid4().hex[:8]}")


class ContainerRun:
    """One run of a role in a container, with the ``Process`` API (``targets/process.py``'s ``Handle``).

    ``start()`` waits for a server role to be ready. Where it sees the container exit (``start``, ``running``,
    ``wait``) it reads the exit as the contract says: 127 with ``kvconform-unsupported`` ends the check
    inconclusive ("the image declares it does not play <role>": not-applicable comes only from declared PICS), 127
    without it is TargetUnavailable, a server role that exits before it is ready is TargetUnavailable; each message
    names the contract item broken (``contract.item``); the container is removed, and its output recorded in the
    evidence, before any of these is raised. ``stop()`` never raises and returns the output as bytes."""

    def __init__(self, spec: ContainerSpec, role: str, what: str) -> None:
        self.spec, self.role, self.what = spec, role, what
        self._container: DockerContainer | None = None
        self._result: ProcessResult | None = None
        self._started = 0.0

    def __enter__(self) -> ContainerRun:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        declared = _UNSUPPORTED.get((self.spec.image, self.role))
        if declared is not None:
            inconclusive(declared)
        self._started = time.monotonic()
        self._container = DockerContainer(self.spec)
        try:
            self._container.start(wait=False)
            if self.spec.ready.log_pattern is not None or self.spec.ready.probe is not None:
                self._await_ready(self._container)
        except BaseException:
            self.stop()
            raise

    def _await_ready(self, container: DockerContainer) -> None:
        outcome = container.await_ready()
        if outcome == "ready":
            wanted = self.spec.ready.probe_port
            line = container.wait_for(lambda text: contract.parse_ready(text) is not None, 0)
            said = contract.parse_ready(line) if line is not None else None
            if said is not None and said.port is not None and wanted is not None and said.port != wanted:
                result = self.stop()
                evidence.record("note", f"{self.what} container", result.evidence())
                raise TargetUnavailable(f"the {self.what} ({self.spec.image}, role {self.role}) said it is ready on "
                                        f"port {said.port}, but was asked to listen on {wanted} "
                                        f"({contract.item('readiness')}): {result.stderr_text[-500:]!r}")
            evidence.note(f"docker: {self.spec.image} ready as {self.role} ({container.id[:12]})")
            return
        exited = outcome.startswith("exited")
        if exited:
            container.wait_exit(2.0)  # the log ended: the exit status follows at once
        result = self.stop()
        self._judge(result)
        evidence.record("note", f"{self.what} container", result.evidence())
        if exited:
            raise TargetUnavailable(f"the {self.what} ({self.spec.image}, role {self.role}) exited "
                                    f"{result.returncode} before it was ready ({contract.item('readiness')}); "
                                    f"stdout {result.stdout_text[-500:]!r}, stderr {result.stderr_text[-500:]!r}")
        raise TargetUnavailable(f"the {self.what} ({self.spec.image}, role {self.role}) was not ready within "
                                f"{self.spec.ready.timeout_s:g} s ({outcome}; stopped; {contract.item('readiness')}); "
                                f"stderr {result.stderr_text[-500:]!r}")

    def _judge(self, result: ProcessResult) -> None:
        """Raise what an exit 127 means under the contract (after recording how the run ended)."""
        lines = (result.stdout + b"\n" + result.stderr).decode("utf-8", "replace").splitlines()
        meaning = contract.exit_meaning(result.returncode, lines, self.role)
        if meaning == "exit":
            return
        evidence.record("note", f"{self.what} container", result.evidence())
        if meaning == "unsupported":
            # Inconclusive, not not-applicable: not-applicable comes only from declared PICS, and a gate run against
            # an image that plays nothing must not pass. The testbed entry's roles: is where a role is left out.
            reason = (f"the image declares it does not play {self.role} ({self.spec.image} exited "
                      f"{contract.UNSUPPORTED_EXIT} with kvconform-unsupported; {contract.item('unsupported')}): "
                      f"nothing of {self.role} was tested; a testbed entry whose roles: leaves {self.role} out makes "
                      f"kvconform run refuse the suite instead")
            _UNSUPPORTED[(self.spec.image, self.role)] = reason
            inconclusive(reason)
        raise TargetUnavailable(
            f"{self.spec.image} exited {contract.UNSUPPORTED_EXIT} as {self.role} without printing "
            f"'kvconform-unsupported role={self.role}' ({contract.item('unsupported')}): a shell's 'command not found' "
            f"exits 127 too, so the harness cannot read it as the image's declaration; "
            f"stderr {result.stderr_text[-500:]!r}")

    def running(self) -> bool:
        if self._result is not None or self._container is None:
            return False
        try:
            state = self._container.status()
        except Exception:  # the daemon went away: it is not running for us
            state = "unknown"
        if state in ("created", "running", "restarting"):
            return True
        self._judge(self.stop())
        return False

    def wait(self, timeout: float) -> int | None:
        if self._result is not None:
            return self._result.returncode
        if self._container is None:
            return None
        code = self._container.wait_exit(timeout)
        if code is None:
            return None
        result = self.stop()
        self._judge(result)
        return result.returncode

    def stop(self, *, timed_out: bool = False) -> ProcessResult:
        if self._result is not None:
            return self._result
        container, self._container = self._container, None
        argv = ("docker", "run", self.spec.image, *self.spec.command)
        if container is None:
            self._result = ProcessResult(argv, None, b"", b"", 0.0, timed_out)
            return self._result
        container.close()
        code = None if timed_out else container.exit_code
        self._result = ProcessResult(argv, code, container.stdout, container.stderr,
                                     time.monotonic() - self._started, timed_out, container.note)
        return self._result


def unsupported_declaration(image: str, role: str) -> str | None:
    """Why the checks of ``role`` are inconclusive when ``image`` declared (exit 127 + ``kvconform-unsupported``) in
    this process that it does not play it; None when it did not."""
    return _UNSUPPORTED.get((image, role))


class ContainerLauncher:
    """A ``Launcher`` (targets/process.py) that plays ``role`` with ``image``: each launch is a ``ContainerRun``.
    The image must declare the contract (label ``org.kvconform.contract=1``); the optional placeholders it
    takes are those its ``org.kvconform.contract.optional`` label names."""

    def __init__(self, image: str, role: str, params: Mapping[str, Any] | None = None,
                 testbed: Testbed | None = None) -> None:
        self.image, self.role = image, role
        self.params = dict(params or {})
        self.testbed = testbed
        self._labels: dict[str, str] | None = None

    def labels(self) -> dict[str, str]:
        """The image's labels (made when missing, by its build recipe); DockerUnavailable when it does not declare
        the contract."""
        global _REAPED
        if self._labels is None:
            client = docker_client()
            try:
                if not _REAPED:
                    reap_orphans(client)
                    _REAPED = True
                ensure_image(client, self.image, build_spec(self.params, self.testbed))
                labels = dict(client.images.get(self.image).labels or {})
            except DockerUnavailable:
                raise
            except Exception as exc:  # the daemon going away between calls
                raise DockerUnavailable(f"cannot inspect image {self.image!r}: {exc}") from exc
            finally:
                client.close()
            declared = labels.get(contract.CONTRACT_LABEL)
            if declared != contract.CONTRACT_VERSION:
                raise DockerUnavailable(
                    f"image {self.image!r}: label {contract.CONTRACT_LABEL} is {declared!r}, expected "
                    f"{contract.CONTRACT_VERSION!r}: it does not declare the kvconform container contract "
                    f"({contract.item('label')}), so the harness will not guess how to ask it for {self.role}")
            self._labels = labels
        return self._labels

    def takes(self, placeholder: str) -> bool:
        role = contract.container_role(self.role)
        if placeholder in role.placeholders:
            return True
        return placeholder in role.optional and placeholder in contract.optional_from_labels(self.labels(),
                                                                                              self.role)

    def launch(self, values: Mapping[str, str], what: str) -> ContainerRun:
        self.labels()
        role = contract.container_role(self.role)
        given = {k: v for k, v in values.items() if k in role.placeholders or self.takes(k)}
        return ContainerRun(contract_spec(self.image, self.role, given, self.params, self.testbed), self.role, what)


class ContainerRelay:
    """The relay driver (``moqt-relay``, ``kvcs-relay``) of a relay image: ``start(policy)`` writes the policy
    (testbeds/schema/moqt-relay-policy.schema.json) and the harness's test certificate into a folder of its own,
    starts the container on a free UDP port of 127.0.0.1 and returns its ``moqt://`` URL once it is ready."""

    def __init__(self, launcher: ContainerLauncher) -> None:
        self.launcher = launcher
        self._run: ContainerRun | None = None
        self._folder: str | None = None
        self.result: ProcessResult | None = None  # how the last container ended (after stop())

    def start(self, policy: dict[str, Any]) -> str:
        self._folder = tempfile.mkdtemp(prefix="kvconform-relay-")
        try:
            folder = Path(self._folder)
            (folder / "policy.yaml").write_text(yaml.safe_dump(policy, sort_keys=False), "utf-8")
            certs = folder / "certs"
            certs.mkdir()
            cert = test_certificate()
            (certs / "cert.pem").write_bytes(cert.certificate_pem)
            (certs / "priv.key").write_bytes(cert.private_key_pem)
            port = free_port("udp")
            self._run = self.launcher.launch({"port": str(port), "policy": str(folder / "policy.yaml"),
                                              "certs": str(certs)}, "relay")
            self._run.start()
        except BaseException:
            self.stop()
            raise
        return f"moqt://{LOOPBACK}:{port}"

    def stop(self) -> None:
        if self._run is not None:
            self.result = self._run.stop()
            evidence.record("note", "relay container", self.result.evidence())
            self._run = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


@contextlib.contextmanager
def play_role(image: str, role: str, values: Mapping[str, str], params: Mapping[str, Any] | None = None,
              what: str = "target") -> Iterator[ContainerRun]:
    """The one call for "run IMAGE as ROLE": ``with play_role(image, "tlkv-decode", {"port": "5050"}) as run:``.

    Makes the image when missing (``params["build"]``), refuses one without the contract label, starts the container
    with the role's arguments and ``KVCONFORM_*`` environment (host network, 127.0.0.1, the harness's uid:gid), waits
    until a server role is ready (bounded), yields the ``ContainerRun``; on leaving it stops the container (SIGTERM,
    SIGKILL after the grace), records its output in the evidence and removes it, however the block ended. After
    the block ``run.stop()`` returns the ``ProcessResult`` (exit status, stdout, stderr as bytes). ``values`` are
    the role's placeholders (``contract.container_role(role)``), ``params`` a target's ``params.docker``. Raises
    TargetUnavailable (the image, the daemon or readiness; inconclusive) and, for a role the image declares it does
    not play, ends the running check inconclusive."""
    run = ContainerLauncher(image, role, params).launch(values, what)
    try:
        run.start()
        yield run
    finally:
        evidence.record("note", f"{what} container", run.stop().evidence())


def contract_driver(suite: str, target: TargetSpec) -> Any:
    """The driver of ``suite`` for a ``docker`` target (``targets/registry.py`` calls it): the role's ``cmd:`` driver
    over a ``ContainerLauncher``, or a ``ContainerRelay``. TargetUnavailable for a role no container can play."""
    role = ROLES.get(suite)
    if role is None or role.container is None or not role.is_suite:
        why = role.no_container if role is not None and role.no_container else "it is not in the container contract"
        raise TargetUnavailable(f"docker target {target.value} cannot play {suite}: {why}")
    launcher = ContainerLauncher(target.value, suite, docker_params(target))
    if role.cmd is None:  # the relays: the harness starts the image with its policy (no cmd: driver of their own)
        return ContainerRelay(launcher)
    return load_ref(role.cmd)(launcher)


def prepare_images(testbed: Testbed, timeout_s: float = 600.0) -> list[str]:
    """Make every docker image the testbed names: its base first (by the base's script, e.g. a debootstrap), then
    the images of its ``defaults.params.docker.images`` recipes and of its ``docker`` targets. Returns the image
    names; bounded."""
    defaults = testbed.defaults.get("params", {}).get("docker", {})
    client = docker_client()
    made: list[str] = []
    try:
        reap_orphans(client)
        base = defaults.get("base")
        if base:
            try:
                client.images.get(base["image"])
            except Exception:
                script = Path(testbed.path).resolve().parent / base["script"]
                print(f"docker: making base image {base['image']} with {script}", flush=True)
                try:
                    subprocess.run(["bash", str(script)], check=True, timeout=timeout_s,
                                   env=_script_env(base["image"]))
                except (subprocess.SubprocessError, OSError) as exc:
                    raise DockerUnavailable(f"base image {base['image']}: {script} failed: {exc}") from exc
            made.append(base["image"])
        images: dict[str, BuildSpec | None] = {}
        for image in defaults.get("images", {}):
            images[image] = build_spec(docker_params(parse_target(f"docker:{image}", testbed)))
        for name, entry in testbed.targets.items():
            if entry["driver"] == "docker":
                target = parse_target(name, testbed)
                images.setdefault(target.value, build_spec(docker_params(target)))
        for image, build in images.items():
            ensure_image(client, image, build)
            made.append(image)
    finally:
        client.close()
    return made


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvconform.targets.docker prepare TESTBED``: make the testbed's images (for CI)."""
    parser = argparse.ArgumentParser(prog="python -m kvconform.targets.docker")
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="make the docker images a testbed names (base, then Dockerfiles)")
    prep.add_argument("testbed")
    prep.add_argument("--timeout", type=float, default=600.0, help="bound of each image build, seconds")
    args = parser.parse_args(argv)
    try:
        images = prepare_images(load_testbed(args.testbed), args.timeout)
    except DockerUnavailable as exc:
        print(f"docker: {exc}", flush=True)
        return 1
    print("docker: images ready: " + ", ".join(images), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
