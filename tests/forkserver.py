"""A fork server for the tests that spawn `kvconform ...`: a pre-imported parent forks a fresh child per run.

About 460 tests run `kvconform run` in a process of its own (tests/mutants/runner.py and the helpers built on it);
each fresh interpreter pays 2-3 s of start-up, most of it importing numpy/ml_dtypes, pytest, grpc, aioquic and
scapy. The server (`python -m tests.forkserver`, one per test process, started on first use) imports those once;
each run is a child forked from it that runs `python -m kvconform ARGV` (runpy, so `__main__`, `sys.argv` and the
exit path are those of a fresh `python -m kvconform`) with the caller's cwd, environment and stdin/stdout/stderr
(file descriptors passed over a Unix socket), in a session and process group of its own, and ends like any
interpreter (atexit, flush, exit status). `run` returns a `subprocess.CompletedProcess`; a child past its bound is
killed with its process group and `subprocess.TimeoutExpired` raised, as `subprocess.run` would.

What the server may import, and why only that:
- nothing that starts a thread or holds a grpc channel/server, an event loop or a socket: a fork copies only the
  calling thread. gRPC starts its threads at grpc_init (the first channel or server), never at import, so
  GRPC_ENABLE_FORK_SUPPORT plays no part. numpy's OpenBLAS pool shuts itself down at fork (pthread_atfork) and
  restarts lazily in the child; the server checks it is down to its one thread before it serves (`_single_threaded`).
- no module pytest would rewrite: `kvconform run` marks every distribution with a pytest11 entry point (kvconform
  itself, xdist, pytest-timeout, allure-pytest, hypothesis) for assertion rewriting before it imports them, so a
  module the server imported first would lose its rewritten asserts in the child. Only third-party libraries
  without a plugin, and `kvconform.cli` (which a fresh `python -m kvconform` imports before pytest too), are
  imported (tests/test_forkserver.py holds the list to that).

A run whose interpreter-level environment (PYTHON*, locale, BLAS/OpenMP and GRPC variables, read at start-up or at
import) differs from the server's, or whose command is not `kvconform`, goes through `subprocess.run` instead.
Set KVCONFORM_TEST_FORKSERVER=0 to send every run there (the old path; tests/test_forkserver.py shows both give
the same verdicts). What a forked child shares with its siblings: the server's hash seed (str hashes are
randomised per server, not per run); Python's `random` and numpy's global RNG are reseeded in each child.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import locale
import os
import runpy
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
ENV_SWITCH = "KVCONFORM_TEST_FORKSERVER"  # "0": every run through subprocess.run (a fresh interpreter)
# Read by the interpreter at start-up or by a library at import: a run that sets them otherwise gets a fresh
# interpreter.
INTERPRETER_ENV = ("PYTHON", "LANG", "LC_", "OPENBLAS", "OMP_", "MKL_", "GRPC_")
# Imported once by the server (see the docstring: no threads, nothing pytest rewrites).
PREIMPORT = (
    "numpy", "numpy.random", "ml_dtypes", "yaml", "jsonschema", "crc32c", "cbor2", "rfc8785",
    "grpc", "grpc.aio", "grpc_tools.protoc", "google.protobuf.message", "google.protobuf.descriptor_pool",
    "google.protobuf.internal.builder",
    "aioquic.asyncio", "aioquic.quic.connection", "aioquic.quic.logger", "OpenSSL", "service_identity",
    "cryptography.x509", "cryptography.hazmat.primitives.asymmetric.ec",
    "cryptography.hazmat.primitives.asymmetric.ed25519",
    "scapy.packet", "scapy.fields",
    "pytest", "_pytest.pytester", "_pytest.doctest", "_pytest.debugging", "execnet", "allure", "allure_commons",
    "pygments.lexers", "lxml.etree",
    "kvconform.cli",
)
START_TIMEOUT = 120.0  # the server's imports; seconds on an idle machine
REAP_TIMEOUT = 60.0  # from killing a child to the server reporting its end
_HEADER = struct.Struct("!I")


class ForkServerError(RuntimeError):
    """The fork server could not start or stopped answering."""


# ------------------------------------------------------------------------------------------------ client


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0"


def _interpreter_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(INTERPRETER_ENV)}


class ForkServer:
    """The client's handle on one server process (see the module docstring)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        self.last_pid: int | None = None  # the child of the latest run
        self._dir = tempfile.mkdtemp(prefix="kvconform-fork-")
        self.address = os.path.join(self._dir, "sock")
        self.log = os.path.join(self._dir, "server.log")
        # stdin stays open for the server's life: its end (this process gone) stops the server and its children.
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.forkserver", self.address], cwd=ROOT,
                                         env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         start_new_session=True)
        assert self.proc.stdout is not None
        line = _readline(self.proc.stdout, START_TIMEOUT)
        if line.strip() != b"ready":
            self.stop()
            raise ForkServerError(f"the fork server did not start within {START_TIMEOUT} s (said {line!r}); its "
                                  f"log:\n{Path(self.log).read_text(errors='replace')[-4000:]}")

    def accepts(self, env: Mapping[str, str]) -> bool:
        """A run with this environment can be forked from this server."""
        return self.proc.poll() is None and _interpreter_env(env) == _interpreter_env(self.env)

    def run(self, argv: Sequence[str], *, cwd: str | os.PathLike[str], env: Mapping[str, str], timeout: float | None,
            text: bool, module: str = "kvconform") -> subprocess.CompletedProcess[Any]:
        """`python -m MODULE ARGV` as a child of this server (`run` says how)."""
        args = [sys.executable, "-m", module, *argv]
        request = json.dumps({"module": module, "argv": list(argv), "cwd": os.fspath(cwd), "env": dict(env)}).encode()
        with (open(os.devnull, "rb") as stdin, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err,
              socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn):
            conn.settimeout(START_TIMEOUT)
            conn.connect(self.address)
            socket.send_fds(conn, [_HEADER.pack(len(request))], [stdin.fileno(), out.fileno(), err.fileno()])
            conn.sendall(request)
            reply = _Lines(conn)
            pid = self.last_pid = int(reply.field(b"pid", START_TIMEOUT))
            try:
                status = int(reply.field(b"exit", timeout))
            except TimeoutError:
                _kill(pid)
                reply.field(b"exit", REAP_TIMEOUT)
                raise subprocess.TimeoutExpired(args, timeout or 0, _read(out, text), _read(err, text)) from None
            except BaseException:  # e.g. the test's own pytest-timeout: the run must not outlive it
                _kill(pid)
                raise
            return subprocess.CompletedProcess(args, status, _read(out, text), _read(err, text))

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            with contextlib.suppress(OSError):
                self.proc.stdin.close()  # the server kills what it still runs and exits
            try:
                self.proc.wait(REAP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(REAP_TIMEOUT)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        for path in (self.address, self.log):
            with contextlib.suppress(OSError):
                os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(self._dir)


def _tree(root: int) -> list[int]:
    """``root`` and its descendants (from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as stat:
                    ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _kill(pid: int) -> None:
    """SIGKILL a child, its process group and every process below it, the targets it started in sessions of their
    own included (a killed run cannot stop them itself). They are stopped first, so none forks in between. The
    server reaps the child only after it has said so, so the pid is still the child's."""
    stopped = _tree(pid)
    for each in stopped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(each, signal.SIGSTOP)
    for each in dict.fromkeys([*stopped, *_tree(pid)]):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(each, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # the child leads its group (setsid) unless killed before it got there


class _Lines:
    """The server's reply, a line at a time, each within its own bound (TimeoutError past it)."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn, self.buffer = conn, b""

    def field(self, name: bytes, timeout: float | None) -> bytes:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer:
            self.conn.settimeout(None if deadline is None else max(deadline - time.monotonic(), 0.001))
            chunk = self.conn.recv(4096)
            if not chunk:
                raise ForkServerError(f"the fork server closed the connection (expected {name.decode()} <n>; "
                                      f"it said {self.buffer!r})")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        word, _, value = line.strip().partition(b" ")
        if word != name:
            raise ForkServerError(f"the fork server answered {line!r}, expected {name.decode()} <n>")
        return value


def _readline(stream: IO[bytes], timeout: float) -> bytes:
    """One line of the server's stdout, or b"" when none comes within ``timeout``."""
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        return stream.readline() if sel.select(timeout) else b""


def _read(file: IO[bytes], text: bool) -> Any:
    file.seek(0)
    data = file.read()
    if not text:
        return data
    # as subprocess.run(text=True) decodes a child's output
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


_lock = threading.Lock()
_server: ForkServer | None = None


def run(argv: Sequence[str], *, cwd: str | os.PathLike[str], env: Mapping[str, str], timeout: float | None,
        text: bool = True) -> subprocess.CompletedProcess[Any]:
    """`python -m kvconform ARGV` in ``cwd`` with ``env`` and stdin from /dev/null, its output captured: a child of
    this process's fork server, or a fresh interpreter (subprocess.run) when the server is switched off or cannot
    give the run the interpreter it asks for. Same result and timeout semantics as ``subprocess.run``."""
    global _server
    if enabled():
        with _lock:
            if _server is None or _server.proc.poll() is not None:
                _server = ForkServer(env)
            server = _server
        if server.accepts(env):
            return server.run(argv, cwd=cwd, env=env, timeout=timeout, text=text)
    return subprocess.run([sys.executable, "-m", "kvconform", *argv], cwd=cwd, env=dict(env), capture_output=True,
                          text=text, timeout=timeout, stdin=subprocess.DEVNULL)


def stop() -> None:
    """Stop this process's fork server (if it started); the next `run` starts another."""
    global _server
    with _lock:
        if _server is not None:
            _server.stop()
            _server = None


# ------------------------------------------------------------------------------------------------ server


class _Job:
    def __init__(self, module: str, argv: list[str], cwd: str, env: dict[str, str]) -> None:
        self.module, self.argv, self.cwd, self.env = module, argv, cwd, env


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _settle_threads() -> None:
    """Fail unless the server is down to one thread. numpy's OpenBLAS starts its pool at import and stops it at
    fork (pthread_atfork), restarting it only when BLAS is called again: one throwaway fork brings it down."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    if threading.active_count() != 1 or _threads() != 1:
        sys.exit(f"fork server: {_threads()} threads after its imports ({threading.enumerate()}); it cannot fork")


def _receive(conn: socket.socket) -> tuple[_Job, list[int]]:
    conn.settimeout(30)
    head, fds, _flags, _addr = socket.recv_fds(conn, _HEADER.size, 3)
    try:
        while len(head) < _HEADER.size:
            head += conn.recv(_HEADER.size - len(head))
        (size,) = _HEADER.unpack(head)
        body = b""
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                raise ConnectionError("the request ended early")
            body += chunk
        request = json.loads(body)
        if len(fds) != 3:
            raise ValueError(f"{len(fds)} file descriptors, expected stdin, stdout and stderr")
        return _Job(request["module"], request["argv"], request["cwd"], request["env"]), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _serve(address: str) -> tuple[_Job, list[int]]:
    """Accept runs until stdin ends. Returns only in a forked child: its run, and its stdin, stdout and stderr."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(0, selectors.EVENT_READ, "control")
    running: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, its caller's connection)
    os.write(1, b"ready\n")
    while True:
        for key, _events in sel.select():
            if key.data == "control" and not os.read(0, 4096):
                for pid, _conn in running.values():  # the caller is gone: so are its runs
                    _kill(pid)
                for pid, _conn in running.values():
                    os.waitpid(pid, 0)
                os._exit(0)
            elif key.data == "accept":
                conn, _ = listener.accept()
                try:
                    job, fds = _receive(conn)
                except (OSError, ValueError, KeyError):
                    conn.close()
                    continue
                if _threads() != 1:
                    conn.sendall(b"error the fork server has more than one thread\n")
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    listener.close()
                    for pidfd, (_pid, other) in running.items():
                        os.close(pidfd)
                        other.close()
                    conn.close()
                    return job, fds
                for fd in fds:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                running[pidfd] = (pid, conn)
                sel.register(pidfd, selectors.EVENT_READ, "child")
                conn.sendall(b"pid %d\n" % pid)
            elif key.data == "child":
                pid, conn = running.pop(key.fd)
                sel.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                with contextlib.suppress(OSError):
                    conn.sendall(b"exit %d\n" % os.waitstatus_to_exitcode(status))
                conn.close()


def _become(job: _Job, fds: list[int]) -> None:
    """Turn this forked child into a fresh `python -m MODULE` of the job's cwd, environment and stdio."""
    os.setsid()  # first: the caller kills the child's process group past its bound
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(job.cwd)
    os.environ.clear()
    os.environ.update(job.env)
    sys.path[0] = os.getcwd()  # what `python -m` puts first
    for name in [m for m in sys.modules if m == "tests" or m.startswith("tests.")]:
        del sys.modules[name]  # the server's own package: a fresh interpreter imports it only if a run does
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()  # the legacy global RNG was seeded once, in the server; `random` reseeds itself at fork
    sys.argv = ["-m", *job.argv]


def main() -> None:
    for name in PREIMPORT:
        importlib.import_module(name)
    _settle_threads()
    job, fds = _serve(sys.argv[1])
    _become(job, fds)
    runpy.run_module(job.module, run_name="__main__", alter_sys=True)  # `python -m kvconform` exits (SystemExit)


if __name__ == "__main__":
    main()
