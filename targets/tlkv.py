"""TLKV drivers: how the suites reach a writer, reader, decode side or prefill side under test.

One protocol per role, four ways to reach it:
- ``reference``: the kvconform reference implementation, in-process;
- ``python:<module>:<factory>``: any object implementing the role's protocol (vendors' own objects,
  and the deliberately broken mutants of the harness's own tests);
- ``cmd:<template>``: a spawned implementation; the placeholders say which role it plays;
- ``grpc://host:port``: a running decode side.
"""

from __future__ import annotations

import contextlib
import json
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from kvconform import evidence
from kvconform.targets.process import Handle, Launcher, ProcessResult, as_launcher
from kvconform.tlkv.content import read_sequence, write_sequence
from kvconform.tlkv.decode import DecodeSide
from kvconform.tlkv.envelope import encode_sequence
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.grpc_decode import DecodeServer
from kvconform.tlkv.prefill import run_prefill
from kvconform.tlkv.reader import EnvelopeError, EnvelopeReader
from kvconform.verdicts import DriverError, TargetUnavailable

OUTCOMES = ("ok", "format", "shape", "version")



@dataclass
class ImportedBlock:
    """One block a reader accepted: hash, fill and decoded values (None when the target cannot show them)."""

    block_hash: int
    n_tokens: int
    kv: npt.NDArray[np.floating] | None = None


@dataclass
class ImportOutcome:
    """What a reader did with one envelope: accepted it (`ok`) or refused it with an error class; the rule it
    says failed (`requirement`, optional), and how many blocks the import allocated (None: it cannot say)."""

    status: str  # one of OUTCOMES
    requirement: str | None = None
    message: str = ""
    blocks: list[ImportedBlock] = field(default_factory=list)
    allocated: int | None = None


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
            return ImportOutcome(exc.kind, exc.requirement, str(exc), allocated=0)
        blocks = [ImportedBlock(r.block_hash, r.n_tokens, np.array(env.kv(i))) for i, r in enumerate(env.records)]
        self.pool.extend(blocks)
        return ImportOutcome("ok", blocks=blocks, allocated=len(blocks))

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
        seq = read_sequence(sequence_file)
        run_prefill(decode_addr, seq.tokens, seq.kv, seq.geometry, seq.version, seq.request_id, timeout)


class RemoteDecode:
    """A decode side already running at a URL: started and stopped by someone else."""

    def __init__(self, address: str) -> None:
        self.address = address

    @classmethod
    def from_url(cls, url: str) -> RemoteDecode:
        """``grpc://host:port`` -> the decode side at host:port."""
        return cls(url.split("://", 1)[1].rstrip("/"))

    def start(self, geometry: Geometry, versions: frozenset[int]) -> str:
        return self.address

    def stop(self) -> None:
        return None


# ---- spawned implementations (cmd:) -----------------------------------------------------------
# Every spawned role runs through targets/process.py: its own session, output to files as bytes, the whole
# process group (and anything that escaped it) stopped at the end, every wait bounded.

# Seconds one spawned export, import or prefill may take: each is one small file in, one out (a second or two
# with an interpreter's start-up on a loaded machine); past it the target hung, and the check fails.
CMD_TIMEOUT = 30.0


def _run(launcher: Launcher, timeout: float, what: str, **values: str) -> ProcessResult:
    """Launch one run with these values, within ``timeout`` s, and record how it ended as evidence. The process
    (and everything it started) is stopped however the wait ends, the check's own bound cutting it included."""
    with launcher.launch(values, what) as proc:
        code = proc.wait(timeout)
        result = proc.stop(timed_out=code is None)
    evidence.record("received", f"{what} process", result.evidence())
    if result.timed_out:
        raise DriverError(f"the {what} {result.argv[0]} did not finish within {timeout:g} s (stopped); "
                          f"stderr: {result.stderr_text[-500:]!r}")
    return result


def _field(result: dict[str, Any], name: str, kind: type, where: str) -> Any:
    value = result.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise DriverError(f"{where}: field {name!r} is {value!r}, expected {kind.__name__}")
    return value


class CmdWriter:
    """A writer spawned per export: `{sequence}` is a sequence file (kvconform.tlkv.content), `{out}` the envelope.
    ``template`` is a cmd: template or any ``Launcher`` (a docker image) of the same contract."""

    def __init__(self, template: str | Launcher, timeout: float = CMD_TIMEOUT) -> None:
        self.launcher, self.timeout = as_launcher(template), timeout

    def export(self, geometry: Geometry, version: int, tokens: Sequence[int],
               kv: npt.NDArray[np.float16]) -> bytes:
        with tempfile.TemporaryDirectory(prefix="kvconform-writer-") as tmp:
            seq, out = Path(tmp) / "sequence.json", Path(tmp) / "envelope.bin"
            write_sequence(seq, geometry=geometry, version=version, tokens=list(tokens), kv=kv, request_id="export")
            proc = _run(self.launcher, self.timeout, "writer", sequence=str(seq), out=str(out))
            if proc.returncode != 0 or not out.exists():
                raise DriverError(f"writer exited {proc.returncode} {'without' if not out.exists() else 'with'} "
                                  f"{out.name}: {proc.stderr_text.strip()[-500:]}")
            return out.read_bytes()


class CmdReaderSession:
    """A reader spawned per import: `{envelope}`, `{pool}` (B,L,Hkv,D), `{versions}` (1,2) and `{out}` (result JSON).

    The result JSON: {"status": "ok"|"format"|"shape"|"version", "requirement": ..., "message": ...,
    "blocks": [{"block_hash", "n_tokens"}], "kv_file": optional raw f32 values, "allocated": optional int}.
    Each import is a fresh process with an empty pool, so "allocated" (the blocks its pool holds when it
    exits) is what that import allocated: 0 for a refused envelope. A reader that leaves it out cannot show
    its allocations, and the checks that need them are inconclusive. A result the harness cannot read is one
    DriverError naming the field (a finding), never a crash.
    """

    def __init__(self, template: str | Launcher, geometry: Geometry, versions: frozenset[int],
                 timeout: float = CMD_TIMEOUT) -> None:
        self.launcher, self.geometry, self.versions = as_launcher(template), geometry, versions
        self.timeout = timeout
        self._allocated: int | None = 0  # no import has run: no process, no pool, nothing allocated

    def import_envelope(self, data: bytes) -> ImportOutcome:
        with tempfile.TemporaryDirectory(prefix="kvconform-reader-") as tmp:
            env, out = Path(tmp) / "envelope.bin", Path(tmp) / "result.json"
            env.write_bytes(data)
            proc = _run(self.launcher, self.timeout, "reader", envelope=str(env), out=str(out),
                        pool=str(self.geometry), versions=",".join(str(v) for v in sorted(self.versions)))
            if not out.exists():
                raise DriverError(f"reader exited {proc.returncode} without a result: "
                                  f"{proc.stderr_text.strip()[-500:]}")
            return self._parse(out)

    def _parse(self, out: Path) -> ImportOutcome:
        where = f"reader result {out.name}"
        try:
            result = json.loads(out.read_bytes())
        except (ValueError, RecursionError) as exc:
            raise DriverError(f"{where}: not JSON: {exc}") from None
        if not isinstance(result, dict):
            raise DriverError(f"{where}: got {type(result).__name__}, expected a JSON object")
        status = result.get("status")
        if status not in OUTCOMES:
            raise DriverError(f"{where}: field 'status' is {status!r}, expected one of {OUTCOMES}")
        raw_blocks = result.get("blocks", [])
        if not isinstance(raw_blocks, list):
            raise DriverError(f"{where}: field 'blocks' is {raw_blocks!r}, expected a list")
        blocks = []
        for i, b in enumerate(raw_blocks):
            if not isinstance(b, dict):
                raise DriverError(f"{where}: blocks[{i}] is {b!r}, expected an object")
            blocks.append(ImportedBlock(_field(b, "block_hash", int, f"{where} blocks[{i}]"),
                                        _field(b, "n_tokens", int, f"{where} blocks[{i}]")))
        if status == "ok" and result.get("kv_file"):
            kv_file = out.parent / Path(_field(result, "kv_file", str, where)).name
            per = int(np.prod(self.geometry.kv_shape))
            try:
                values = np.fromfile(kv_file, "<f4")
            except OSError as exc:
                raise DriverError(f"{where}: kv_file {kv_file.name}: {exc}") from None
            if values.size != per * len(blocks):
                raise DriverError(f"{where}: kv_file holds {values.size} f32 values, expected {per * len(blocks)} "
                                  f"({len(blocks)} blocks of {self.geometry.kv_shape})")
            for i, block in enumerate(blocks):
                block.kv = values[i * per : (i + 1) * per].reshape(self.geometry.kv_shape)
        allocated: int | None = None
        if result.get("allocated") is not None:
            allocated = _field(result, "allocated", int, where)
            if allocated < 0:
                raise DriverError(f"{where}: field 'allocated' is {allocated}, expected a count >= 0")
        self._allocated = None if allocated is None or self._allocated is None else self._allocated + allocated
        requirement = result.get("requirement")
        message = result.get("message", "")
        return ImportOutcome(status, requirement if isinstance(requirement, str) else None,
                             message if isinstance(message, str) else repr(message), blocks, allocated)

    def allocated(self) -> int | None:
        """Blocks the imports of this session allocated; None once one of them did not say."""
        return self._allocated


class CmdReader:
    """Opens spawned-reader sessions; every import is a fresh process."""

    def __init__(self, template: str | Launcher) -> None:
        self.launcher = as_launcher(template)

    def open(self, geometry: Geometry, versions: frozenset[int]) -> ReaderSession:
        return CmdReaderSession(self.launcher, geometry, versions)


class CmdPrefill:
    """A prefill side spawned per transfer: `{decode_addr}`, `{sequence}` (alias `{tokens_file}`)."""

    def __init__(self, template: str | Launcher) -> None:
        self.launcher = as_launcher(template)

    def prefill(self, decode_addr: str, sequence_file: Path, timeout: float) -> None:
        proc = _run(self.launcher, timeout, "prefill side", decode_addr=decode_addr, sequence=str(sequence_file),
                    tokens_file=str(sequence_file))
        if proc.returncode != 0:
            raise DriverError(f"prefill exited {proc.returncode}: {proc.stderr_text.strip()[-500:]}")


class CmdDecode:
    """A decode side the harness starts: `{port}` (a free port on 127.0.0.1 it must listen on), optionally
    `{pool}` (B,L,Hkv,D of the declared geometry) and `{versions}` (1,2); ready once the port accepts a TCP
    connection (bounded), stopped with its whole process group at the end."""

    READY_TIMEOUT = 30.0

    def __init__(self, template: str | Launcher) -> None:
        self.launcher = as_launcher(template)
        self._proc: Handle | None = None

    def start(self, geometry: Geometry, versions: frozenset[int]) -> str:
        port = free_tcp_port()
        values = {"port": str(port), "pool": str(geometry), "versions": ",".join(str(v) for v in sorted(versions))}
        self._proc = self.launcher.launch(values, "decode side")
        self._proc.start()
        deadline = time.monotonic() + self.READY_TIMEOUT
        while time.monotonic() < deadline:
            if not self._proc.running():
                result = self._proc.stop()
                evidence.record("received", "decode side process", result.evidence())
                raise TargetUnavailable(f"the decode side exited {result.returncode} before listening on {port}: "
                                        f"{result.stderr_text.strip()[-500:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return f"127.0.0.1:{port}"
            self._proc.wait(0.05)  # bounded by the deadline: it either starts listening or exits
        self.stop()
        raise TargetUnavailable(f"the decode side did not listen on 127.0.0.1:{port} within {self.READY_TIMEOUT:g} s")

    def stop(self) -> None:
        if self._proc is not None:
            evidence.record("note", "decode side process", self._proc.stop().evidence())
            self._proc = None


def free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 free at this moment (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def decode_service(driver: DecodeService, geometry: Geometry, versions: frozenset[int]) -> Iterator[str]:
    """Start a decode side, yield its address, always stop it."""
    address = driver.start(geometry, versions)
    try:
        yield address
    finally:
        driver.stop()
