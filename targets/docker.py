"""Docker driver: a third-party peer run as a container on the host's network, talking on 127.0.0.1 only.

Every container runs with ``network_mode="host"``: no port is ever published and the docker bridge (a
private address range tests must never send to) is never used, so a peer is reached exactly like a local
process, on 127.0.0.1. Images are built locally when missing (see ``testbeds/docker/``): no registry.

The ``docker`` SDK is an optional dependency (extra ``docker``). Without it, or without a reachable
daemon, or when an image cannot be built, the driver raises :class:`DockerUnavailable`, a
``TargetUnavailable``: a setup problem (verdict inconclusive), never a verdict on the peer.

Container output is followed by a thread while the container runs: each line goes to the running test's
evidence (``docker-log`` events) and to :attr:`DockerContainer.lines`, which is what a readiness log
pattern is matched against.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from kvconform.fixtures import evidence
from kvconform.targets.drivers import DriverError, TargetUnavailable
from kvconform.targets.spec import TargetSpec
from kvconform.targets.testbed import Testbed

if TYPE_CHECKING:  # the SDK is optional at run time
    from docker import DockerClient
    from docker.models.containers import Container

__all__ = [
    "HARNESS_LABEL",
    "LOOPBACK",
    "OWNER_LABEL",
    "BuildSpec",
    "ContainerSpec",
    "DockerContainer",
    "DockerUnavailable",
    "Readiness",
    "RunResult",
    "build_spec",
    "container_spec",
    "docker_client",
    "docker_params",
    "docker_problem",
    "ensure_image",
    "free_port",
    "main",
    "prepare_images",
    "reap_orphans",
    "run_to_completion",
    "running",
]

LOOPBACK = "127.0.0.1"
HARNESS_LABEL = "org.kvconform.harness"
OWNER_LABEL = "org.kvconform.pid"
ProbeKind = Literal["tcp", "udp-bound"]


class DockerUnavailable(TargetUnavailable):
    """Docker cannot be used here (no SDK, no daemon, image missing and not buildable)."""


@dataclass(frozen=True)
class BuildSpec:
    """How to build an image that is missing: a context folder, its Dockerfile and build args."""

    context: Path
    dockerfile: str = "Dockerfile"
    buildargs: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0


@dataclass(frozen=True)
class Readiness:
    """When a started container counts as ready: a log line matching ``log_pattern`` and/or a probe of
    ``probe_port`` on 127.0.0.1 succeeding, both within ``timeout_s``."""

    log_pattern: str | None = None
    probe: ProbeKind | None = None
    probe_port: int | None = None
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if (self.probe is None) != (self.probe_port is None):
            raise ValueError("Readiness: probe and probe_port go together")


@dataclass(frozen=True)
class ContainerSpec:
    """A container to run: image, command, environment, read-only bind mounts (host -> container)."""

    image: str
    command: Sequence[str]
    environment: Mapping[str, str] = field(default_factory=dict)
    mounts: Mapping[str, str] = field(default_factory=dict)
    name: str | None = None
    ready: Readiness = field(default_factory=Readiness)
    build: BuildSpec | None = None
    stop_timeout_s: int = 5


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
        import docker
        from docker.errors import DockerException
    except ImportError as exc:
        raise DockerUnavailable(f"the docker SDK is not installed (pip install 'kvconform[docker]'): {exc}") from exc
    try:
        client = docker.from_env(timeout=int(timeout_s))
        client.ping()
    except DockerException as exc:
        raise DockerUnavailable(f"the docker daemon is not reachable: {exc}") from exc
    return client


def ensure_image(client: DockerClient, image: str, build: BuildSpec | None = None) -> str:
    """The id of ``image``, building it from ``build`` (host networking, no registry) when it is missing."""
    from docker.errors import BuildError, DockerException, ImageNotFound

    try:
        return str(client.images.get(image).id)
    except ImageNotFound:
        if build is None:
            raise DockerUnavailable(f"image {image!r} is not present and no build recipe was given") from None
    except DockerException as exc:
        raise DockerUnavailable(f"cannot inspect image {image!r}: {exc}") from exc
    if not (build.context / build.dockerfile).is_file():
        raise DockerUnavailable(f"image {image!r}: no Dockerfile at {build.context / build.dockerfile}")
    evidence.note(f"docker: building {image} from {build.context}/{build.dockerfile}")
    # A client of its own: the build's bound is the HTTP read timeout of that call.
    builder = docker_client(timeout_s=build.timeout_s)
    try:
        built, _log = builder.images.build(
            path=str(build.context), dockerfile=build.dockerfile, tag=image, buildargs=dict(build.buildargs),
            network_mode="host", rm=True, forcerm=True, pull=False,
        )
    except (BuildError, DockerException) as exc:
        raise DockerUnavailable(f"building image {image!r} from {build.context} failed: {exc}") from exc
    finally:
        builder.close()
    return str(built.id)


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
    from docker.errors import DockerException

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
    """The only way containers are created here: host network, nothing published, read-only mounts."""
    kwargs: dict[str, Any] = {
        "command": list(spec.command),
        "environment": dict(spec.environment),
        "network_mode": "host",
        "volumes": {host: {"bind": inside, "mode": "ro"} for host, inside in spec.mounts.items()},
        "detach": True,
        # The owner's pid lets a later run remove what a killed run left behind (reap_orphans).
        "labels": {HARNESS_LABEL: "1", OWNER_LABEL: str(os.getpid())},
    }
    if spec.name:
        kwargs["name"] = spec.name
    return kwargs


class DockerContainer:
    """A running container with a log follower; a context manager that stops and removes it."""

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

    def start(self) -> DockerContainer:
        """Ensure the image, run the container, follow its output and wait until it is ready."""
        from docker.errors import DockerException

        ensure_image(self.client, self.spec.image, self.spec.build)
        evidence.record("sent", "docker-run", {"image": self.spec.image, "command": list(self.spec.command),
                                                "environment": dict(self.spec.environment), "network": "host"})
        try:
            self._container = self.client.containers.run(self.spec.image, **_run_kwargs(self.spec))
        except DockerException as exc:
            raise DockerUnavailable(f"cannot start a container of {self.spec.image!r}: {exc}") from exc
        self._follower = threading.Thread(target=self._follow, name=f"docker-log-{self.id[:12]}", daemon=True)
        self._follower.start()
        try:
            self.wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop (bounded) and remove the container, then end the log follower; idempotent."""
        from docker.errors import DockerException, NotFound

        container, self._container = self._container, None
        if container is not None:
            with contextlib.suppress(NotFound):
                try:
                    container.stop(timeout=self.spec.stop_timeout_s)
                except DockerException:
                    container.kill()
                container.remove(force=True)
            evidence.record("note", "docker-stopped", {"image": self.spec.image, "id": str(container.id)[:12]})
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
        evidence.record("received", "docker-log", {"container": self.id[:12], "line": line})
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
        deadline = time.monotonic() + timeout_s
        seen = 0
        with self._new_line:
            while True:
                for line in self.lines[seen:]:
                    if regex.search(line):
                        return line
                seen = len(self.lines)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._log_ended:
                    raise DriverError(
                        f"container {self.spec.image}: no output line matching {pattern!r} within {timeout_s} s; "
                        f"last lines: {self.lines[-10:]!r}")
                self._new_line.wait(remaining)

    def status(self) -> str:
        """The container's state as docker reports it (running, exited, ...)."""
        if self._container is None:
            return "removed"
        self._container.reload()
        return str(self._container.status)

    def wait_ready(self) -> None:
        """Wait (bounded by the spec's readiness timeout) for the log line and the port probe."""
        ready = self.spec.ready
        deadline = time.monotonic() + ready.timeout_s
        try:
            if ready.log_pattern is not None:
                self.wait_for_line(ready.log_pattern, ready.timeout_s)
            if ready.probe is not None and ready.probe_port is not None:
                while not _probe(ready.probe, ready.probe_port):
                    if self.status() != "running":
                        raise DriverError("container exited")
                    if time.monotonic() >= deadline:
                        raise DriverError(f"{ready.probe} probe of 127.0.0.1:{ready.probe_port} failed")
                    # A short poll: there is no event to wait on for a port being bound.
                    threading.Event().wait(0.05)
        except DriverError as exc:
            raise TargetUnavailable(
                f"container of {self.spec.image} ({' '.join(self.spec.command)}) not ready within "
                f"{ready.timeout_s} s: {exc}; status {self.status()}; output:\n{self.output()[-4000:]}") from exc
        evidence.note(f"docker: {self.spec.image} ready ({self.id[:12]})")


def run_to_completion(spec: ContainerSpec, timeout_s: float, client: DockerClient | None = None) -> RunResult:
    """Run a one-shot container (e.g. a peer's test client) to its end, bounded by ``timeout_s``; the
    container is removed afterwards. A container still running at the bound is killed: DriverError."""
    from docker.errors import DockerException

    own = client is None
    client = client or docker_client()
    try:
        ensure_image(client, spec.image, spec.build)
        evidence.record("sent", "docker-run", {"image": spec.image, "command": list(spec.command),
                                                "environment": dict(spec.environment), "network": "host"})
        try:
            container = client.containers.run(spec.image, **_run_kwargs(spec))
        except DockerException as exc:
            raise DockerUnavailable(f"cannot start a container of {spec.image!r}: {exc}") from exc
        try:
            try:
                status = container.wait(timeout=timeout_s)
            except Exception as exc:  # requests' ReadTimeout or a connection error: the bound was hit
                container.kill()
                raise DriverError(f"container {spec.image} {list(spec.command)} still running after "
                                  f"{timeout_s} s; killed") from exc
            stdout = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
            stderr = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
        finally:
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


# ---- testbed targets run in docker ------------------------------------------------------------------


def _fill(text: str, placeholders: Mapping[str, str]) -> str:
    for key, value in placeholders.items():
        text = text.replace("{" + key + "}", value)
    return text


def docker_params(target: TargetSpec, testbed: Testbed) -> dict[str, Any]:
    """The target's ``params.docker`` over the testbed's ``defaults.params.docker``."""
    merged: dict[str, Any] = dict(testbed.defaults.get("params", {}).get("docker", {}))
    merged.update(target.params.get("docker", {}))
    if "image" not in merged:
        raise DockerUnavailable(f"testbed {testbed.path} target {target.name}: params.docker.image is missing")
    return merged


def container_spec(target: TargetSpec, testbed: Testbed, placeholders: Mapping[str, str],
                   name: str | None = None) -> ContainerSpec:
    """The container that runs a testbed ``cmd`` target inside its ``params.docker`` image, with the
    ``{placeholders}`` of its command line, mounts and readiness pattern filled in."""
    if target.kind != "cmd":
        raise DockerUnavailable(f"target {target.name}: a docker target is a cmd: target, got {target.kind}")
    params = docker_params(target, testbed)
    mounts = {_fill(host, placeholders): inside for host, inside in params.get("mounts", {}).items()}
    # A placeholder naming a mounted host folder becomes that folder's path inside the container.
    inside = {key: mounts.get(value, value) for key, value in placeholders.items()}
    command = shlex.split(_fill(target.value, inside))
    left = re.findall(r"\{[a-z_]+\}", " ".join(command))
    if left:
        raise DockerUnavailable(f"target {target.name}: placeholders {left} have no value")
    ready = params.get("ready", {})
    port = ready.get("port", placeholders.get("port"))
    readiness = Readiness(
        log_pattern=_fill(ready["log"], placeholders) if "log" in ready else None,
        probe=ready.get("probe"),
        probe_port=int(port) if ready.get("probe") and port is not None else None,
        timeout_s=float(ready.get("timeout_s", 30.0)),
    )
    return ContainerSpec(image=params["image"], command=command, mounts=mounts, name=name, ready=readiness,
                         build=build_spec(params, testbed))


def build_spec(params: Mapping[str, Any], testbed: Testbed) -> BuildSpec | None:
    """The BuildSpec of ``params.docker.build`` (paths relative to the testbed file)."""
    build = params.get("build")
    if not build:
        return None
    root = Path(testbed.path).resolve().parent
    return BuildSpec(context=root / build["context"], dockerfile=build.get("dockerfile", "Dockerfile"),
                     buildargs=dict(build.get("buildargs", {})), timeout_s=float(build.get("timeout_s", 600)))


def prepare_images(testbed: Testbed, timeout_s: float = 600.0) -> list[str]:
    """Make every docker image the testbed names: its base first (by the base's script, e.g. a
    debootstrap), then the images built from its Dockerfiles. Returns the image names; bounded."""
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
                                   env={**os.environ, "IMAGE": base["image"]})
                except (subprocess.SubprocessError, OSError) as exc:
                    raise DockerUnavailable(f"base image {base['image']}: {script} failed: {exc}") from exc
            made.append(base["image"])
        seen: set[str] = set()
        for name in testbed.targets:
            params = docker_params(TargetSpec(name, "cmd", "", None, {}, testbed.targets[name].get("params", {})),
                                   testbed)
            if params["image"] in seen:
                continue
            seen.add(params["image"])
            ensure_image(client, params["image"], build_spec(params, testbed))
            made.append(params["image"])
    finally:
        client.close()
    return made


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvconform.targets.docker prepare TESTBED``: make the testbed's images (for CI)."""
    import argparse

    from kvconform.targets.testbed import load_testbed

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
