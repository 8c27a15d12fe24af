"""TLKV drivers: how the suites reach a writer, reader, decode side or prefill side under test.

One protocol per role, four ways to reach it:
- ``reference``: the kvconform reference implementation, in-process;
- ``python:<module>:<factory>``: any object implementing the role's protocol (vendors' own objects,
  and the deliberately broken mutants of the harness's own tests);
- ``cmd:<template>``: a spawned implementation; the placeholders say which role it plays;
- ``grpc://host:port``: a running decode side.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from kvconform.targets.drivers import DriverError, TargetUnavailable, python_driver
from kvconform.targets.spec import CMD_PLACEHOLDER_ROLES, cmd_roles
from kvconform.tlkv.envelope import encode_sequence
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.reader import EnvelopeError, EnvelopeReader

OUTCOMES = ("ok", "format", "shape", "version")



@dataclass
class ImportedBlock:
    """One block a reader accepted: hash, fill and decoded values (None when the target cannot show them)."""

    block_hash: int
    n_tokens: int
    kv: npt.NDArray[np.floating] | None = None


@dataclass
class ImportOutcome:
    """What a reader did with one envelope: accepted it (`ok`) or refused it with an error class."""

    status: str  # one of OUTCOMES
    requirement: str | None = None
    message: str = ""
    blocks: list[ImportedBlock] = field(default_factory=list)


# ---- role protocols ------------------------------------------------------------------------


@runtime_checkable
class Writer(Protocol):
    """tlkv-writer: exports a token sequence's blocks as one envelope (tl_kv_export)."""

    def export(self, geometry: Geometry, version: int, tokens: Sequence[int],
               kv: npt.NDArray[np.float16]) -> bytes: ...


@runtime_checkable
class ReaderSession(Protocol):
    """One reader with a pool of fixed geometry (tl_kv_import)."""

    def import_envelope(self, data: bytes) -> ImportOutcome: ...

    def allocated(self) -> int | None:
        """Blocks allocated in the pool so far, or None when the target cannot say."""
        ...


@runtime_checkable
class Reader(Protocol):
    """tlkv-reader: opens a reader for a pool geometry and the versions it should read."""

    def open(self, geometry: Geometry, versions: frozenset[int]) -> ReaderSession: ...


@runtime_checkable
class DecodeService(Protocol):
    """tlkv-decode: a tl.kv.v1 server the harness can start and stop (address "host:port")."""

    def start(self, geometry: Geometry, versions: frozenset[int]) -> str: ...

    def stop(self) -> None: ...


@runtime_checkable
class Prefill(Protocol):
    """tlkv-prefill: transfers the sequence in `sequence_file` to the decode side at `decode_addr`."""

    def prefill(self, decode_addr: str, sequence_file: Path, timeout: float) -> None: ...


# ---- reference implementations ---------------------------------------------------------------


class ReferenceWriter:
    """The reference writer (kvconform.tlkv.envelope)."""

    def export(self, geometry: Geometry, version: int, tokens: Sequence[int],
               kv: npt.NDArray[np.float16]) -> bytes:
        return encode_sequence(geometry, version, tokens, kv)


class ReferenceReaderSession:
    """The reference reader over a pool that allocates only after every rule has passed."""

    reader_class: type[EnvelopeReader] = EnvelopeReader

    def __init__(self, geometry: Geometry, versions: frozenset[int]) -> None:
        self.reader = self.reader_class(geometry, versions)
        self.pool: list[ImportedBlock] = []

    def import_envelope(self, data: bytes) -> ImportOutcome:
        try:
            env = self.reader.read(data)
        except EnvelopeError as exc:
            return ImportOutcome(exc.kind, exc.requirement, str(exc))
        blocks = [ImportedBlock(r.block_hash, r.n_tokens, np.array(env.kv(i))) for i, r in enumerate(env.records)]
        self.pool.extend(blocks)
        return ImportOutcome("ok", blocks=blocks)

    def allocated(self) -> int | None:
        return len(self.pool)


class ReferenceReader:
    """Opens reference reader sessions for any geometry and set of versions."""

    session_class: type[ReferenceReaderSession] = ReferenceReaderSession

    def open(self, geometry: Geometry, versions: frozenset[int]) -> ReaderSession:
        return self.session_class(geometry, versions)


class ReferenceDecode:
    """The reference decode side served by gRPC on 127.0.0.1 with an ephemeral port."""

    def __init__(self, side_factory: Callable[[Geometry, frozenset[int]], Any] | None = None,
                 server_options: dict[str, Any] | None = None, server_class: type | None = None) -> None:
        self._side_factory = side_factory
        self._server_options = server_options or {}
        self._server_class = server_class
        self._server: Any = None

    def start(self, geometry: Geometry, versions: frozenset[int]) -> str:
        from kvconform.tlkv.decode import DecodeSide
        from kvconform.tlkv.grpc_decode import DecodeServer

        side = (self._side_factory or DecodeSide)(geometry, versions)
        server_class = self._server_class or DecodeServer
        self._server = server_class(side, host="127.0.0.1", port=0, **self._server_options)
        port = self._server.start()
        return f"127.0.0.1:{port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0)
            self._server = None


class ReferencePrefill:
    """The reference prefill side (kvconform.tlkv.prefill), in-process."""

    def prefill(self, decode_addr: str, sequence_file: Path, timeout: float) -> None:
        from kvconform.tlkv.content import read_sequence
        from kvconform.tlkv.prefill import run_prefill

        seq = read_sequence(sequence_file)
        run_prefill(decode_addr, seq.tokens, seq.kv, seq.geometry, seq.version, seq.request_id, timeout)


class RemoteDecode:
    """A decode side already running at a URL: started and stopped by someone else."""

    def __init__(self, address: str) -> None:
        self.address = address

    def start(self, geometry: Geometry, versions: frozenset[int]) -> str:
        return self.address

    def stop(self) -> None:
        return None


# ---- spawned implementations (cmd:) -----------------------------------------------------------


def _run(template: str, timeout: float, **values: str) -> subprocess.CompletedProcess[str]:
    """Split the template like a shell, fill placeholders per argument, run it with a bound on its time."""
    argv = [arg.format(**values) for arg in shlex.split(template)]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise DriverError(f"{argv[0]} did not finish within {timeout} s") from exc
    except OSError as exc:
        raise TargetUnavailable(f"cannot start {argv!r}: {exc}") from exc


class CmdWriter:
    """A writer spawned per export: `{sequence}` is a sequence file (kvconform.tlkv.content), `{out}` the envelope."""

    def __init__(self, template: str, timeout: float = 60.0) -> None:
        self.template, self.timeout = template, timeout

    def export(self, geometry: Geometry, version: int, tokens: Sequence[int],
               kv: npt.NDArray[np.float16]) -> bytes:
        from kvconform.tlkv.content import write_sequence

        with tempfile.TemporaryDirectory(prefix="kvconform-writer-") as tmp:
            seq, out = Path(tmp) / "sequence.json", Path(tmp) / "envelope.bin"
            write_sequence(seq, geometry=geometry, version=version, tokens=list(tokens), kv=kv, request_id="export")
            proc = _run(self.template, self.timeout, sequence=str(seq), out=str(out))
            if proc.returncode != 0 or not out.exists():
                raise DriverError(f"writer exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
            return out.read_bytes()


class CmdReaderSession:
    """A reader spawned per import: `{envelope}`, `{pool}` (B,L,Hkv,D), `{versions}` (1,2) and `{out}` (result JSON).

    The result JSON: {"status": "ok"|"format"|"shape"|"version", "requirement": ..., "message": ...,
    "blocks": [{"block_hash", "n_tokens"}], "kv_file": optional raw f32 values, "allocated": optional int}.
    """

    def __init__(self, template: str, geometry: Geometry, versions: frozenset[int], timeout: float = 60.0) -> None:
        self.template, self.geometry, self.versions, self.timeout = template, geometry, versions, timeout
        self._allocated: int | None = None

    def import_envelope(self, data: bytes) -> ImportOutcome:
        with tempfile.TemporaryDirectory(prefix="kvconform-reader-") as tmp:
            env, out = Path(tmp) / "envelope.bin", Path(tmp) / "result.json"
            env.write_bytes(data)
            proc = _run(self.template, self.timeout, envelope=str(env), out=str(out), pool=str(self.geometry),
                        versions=",".join(str(v) for v in sorted(self.versions)))
            if not out.exists():
                raise DriverError(f"reader exited {proc.returncode} without a result: {proc.stderr.strip()[-500:]}")
            result = json.loads(out.read_text())
            status = result.get("status")
            if status not in OUTCOMES:
                raise DriverError(f"reader result status: got {status!r}, expected one of {OUTCOMES}")
            blocks = [ImportedBlock(int(b["block_hash"]), int(b["n_tokens"])) for b in result.get("blocks", [])]
            if status == "ok" and result.get("kv_file"):
                values = np.fromfile(out.parent / result["kv_file"], "<f4")
                per = int(np.prod(self.geometry.kv_shape))
                for i, block in enumerate(blocks):
                    block.kv = values[i * per : (i + 1) * per].reshape(self.geometry.kv_shape)
            if "allocated" in result:
                self._allocated = int(result["allocated"])
            return ImportOutcome(status, result.get("requirement"), result.get("message", ""), blocks)

    def allocated(self) -> int | None:
        return self._allocated


class CmdReader:
    """Opens spawned-reader sessions; every import is a fresh process."""

    def __init__(self, template: str) -> None:
        self.template = template

    def open(self, geometry: Geometry, versions: frozenset[int]) -> ReaderSession:
        return CmdReaderSession(self.template, geometry, versions)


class CmdPrefill:
    """A prefill side spawned per transfer: `{decode_addr}`, `{sequence}` (alias `{tokens_file}`)."""

    def __init__(self, template: str) -> None:
        self.template = template

    def prefill(self, decode_addr: str, sequence_file: Path, timeout: float) -> None:
        proc = _run(self.template, timeout, decode_addr=decode_addr, sequence=str(sequence_file),
                    tokens_file=str(sequence_file))
        if proc.returncode != 0:
            raise DriverError(f"prefill exited {proc.returncode}: {proc.stderr.strip()[-500:]}")


# ---- resolution ----------------------------------------------------------------------------------


ROLE_PROTOCOLS: dict[str, type] = {
    "tlkv-writer": Writer,
    "tlkv-reader": Reader,
    "tlkv-decode": DecodeService,
    "tlkv-prefill": Prefill,
}


def reference_driver(suite: str) -> Any:
    return {"tlkv-writer": ReferenceWriter, "tlkv-reader": ReferenceReader,
            "tlkv-decode": ReferenceDecode, "tlkv-prefill": ReferencePrefill}[suite]()


def driver_for(suite: str, kind: str, value: str) -> Any:
    """Build the driver of `suite` for a target of `kind` ("reference", "python", "cmd", "url")."""
    if kind == "reference":
        return reference_driver(suite)
    if kind == "python":
        return python_driver(value, suite, ROLE_PROTOCOLS[suite])
    if kind == "cmd":
        template = value
        if suite not in cmd_roles(template):
            wanted = next((ph for ph, s in CMD_PLACEHOLDER_ROLES.items() if s == suite), "?")
            raise DriverError(f"cmd target {template!r}: plays {sorted(cmd_roles(template))}, not {suite} "
                              f"(placeholder {wanted} missing)")
        return {"tlkv-writer": CmdWriter, "tlkv-reader": CmdReader, "tlkv-prefill": CmdPrefill}[suite](template)
    if kind == "url" and suite == "tlkv-decode":
        address = value.split("://", 1)[1].rstrip("/")
        return RemoteDecode(address)
    raise DriverError(f"target {kind}:{value} cannot play {suite}")


@contextmanager
def decode_service(driver: DecodeService, geometry: Geometry, versions: frozenset[int]) -> Iterator[str]:
    """Start a decode side, yield its address, always stop it."""
    address = driver.start(geometry, versions)
    try:
        yield address
    finally:
        driver.stop()
