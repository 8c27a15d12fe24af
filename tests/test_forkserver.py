"""The fork server the tests spawn `kvconform` through (tests/forkserver.py), and the bound each spawning test gets
(tests/spawn.py): a child is a fresh process of its own cwd, environment, stdio, session and RNG state; a run past
its bound is killed with everything it started; a run gives the same verdicts forked as in a fresh interpreter."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import json
import math
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import forkserver, spawn
from tests.mutants.runner import RUN_BOUND, TESTBED, Run, run_suite

PROBE = "tests.forkserver_probe"


@pytest.fixture(scope="module")
def server() -> Iterator[forkserver.ForkServer]:
    started = forkserver.ForkServer(spawn.spawn_env())
    try:
        yield started
    finally:
        started.stop()


def _probe(server: forkserver.ForkServer, cwd: Path, env: dict[str, str], status: int = 0) -> tuple[int, Any, str]:
    proc = server.run([str(status)], cwd=cwd, env=env, timeout=120, text=True, module=PROBE)
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def _cli_imports() -> set[str]:
    """The kvconform modules a fresh `python -m kvconform` has imported when pytest starts: kvconform.cli's."""
    probe = "import json, sys, kvconform.cli; print(json.dumps([m for m in sys.modules if m.startswith('kvconform')]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    return set(json.loads(out.stdout))


def test_a_child_is_a_fresh_process_of_its_own_cwd_environment_and_stdio(server: forkserver.ForkServer,
                                                                          tmp_path: Path) -> None:
    env = {**spawn.spawn_env(), "KVCONFORM_PROBE": "one"}
    code, first, err = _probe(server, tmp_path, env, status=3)
    assert code == 3 and err == "to stderr\n"
    assert first["cwd"] == str(tmp_path) and first["path0"] == str(tmp_path)
    assert first["env"] == env
    assert first["argv"] == [str(Path(forkserver.ROOT, *PROBE.split(".")).with_suffix(".py")), "3"]
    assert first["main"] == first["argv"][0] and first["stdin"] == ""
    assert first["pid"] == first["pgid"] == first["sid"], "a session and process group of its own"
    assert first["pid"] not in (os.getpid(), server.proc.pid)
    assert first["threads"] == 1
    # nothing of kvconform pytest would rewrite: only what `python -m kvconform` imports before pytest starts
    assert set(first["kvconform_modules"]) <= _cli_imports()

    other = {k: v for k, v in spawn.spawn_env().items() if k != "HOME"}
    code, second, _ = _probe(server, forkserver.ROOT, other)
    assert code == 0 and second["env"] == other and second["cwd"] == str(forkserver.ROOT)
    assert not second["seen_before"], "module state a run changed reached the next run"
    assert second["pid"] != first["pid"]
    assert (second["random"], second["numpy_random"]) != (first["random"], first["numpy_random"]), \
        "each child draws its own random numbers"


def test_a_run_whose_interpreter_environment_differs_gets_a_fresh_interpreter(server: forkserver.ForkServer) -> None:
    env = spawn.spawn_env()
    assert server.accepts(env)
    assert not server.accepts({**env, "PYTHONHASHSEED": "1"})
    assert not server.accepts({k: v for k, v in env.items() if k != "PYTHONPATH"})
    assert server.accepts({**env, "KVCONFORM_ANYTHING": "1"})


def _gone(pid: int) -> bool:
    """The process has ended (a zombie has), waiting for it at most 30 s: a SIGKILL is delivered asynchronously."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], 30)[0])
    finally:
        os.close(fd)


def test_a_run_past_its_bound_is_killed_with_everything_it_started(server: forkserver.ForkServer,
                                                                   tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        server.run(["hang", str(pids)], cwd=tmp_path, env=spawn.spawn_env(), timeout=20, text=True, module=PROBE)
    assert raised.value.timeout == 20
    assert server.last_pid is not None and _gone(server.last_pid)
    # The probe's own child in its process group, and one in a session of its own (as a `cmd:` target's is). A
    # machine too loaded to start them within the bound killed the probe before: then there are none to look for.
    if pids.exists():
        started = [int(p) for p in pids.read_text().split()]
        assert len(started) == 2 and all(_gone(p) for p in started)


def test_the_server_imports_nothing_pytest_would_rewrite_in_a_fresh_run() -> None:
    """`kvconform run` marks every module of a distribution with a pytest11 entry point for assertion rewriting; a
    module the server imported first would run unrewritten in its children."""
    rewritten: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        if any(ep.group == "pytest11" for ep in dist.entry_points):
            for file in dist.files or ():
                parts = Path(str(file)).parts
                if parts and file.suffix == ".py" and ".dist-info" not in parts[0]:
                    rewritten[parts[0].removesuffix(".py")] = dist.metadata["Name"]
    rewritten.update({"kvconform": "kvconform"})  # the editable install lists no files of the package itself
    early = {"kvconform.cli"}  # what `python -m kvconform` imports before pytest starts
    bad = {m: rewritten[m.split(".")[0]] for m in forkserver.PREIMPORT
           if m.split(".")[0] in rewritten and m not in early}
    assert not bad, f"the fork server imports modules of pytest plugins: {bad}"


@contextlib.contextmanager
def _switched(monkeypatch: pytest.MonkeyPatch, on: bool) -> Iterator[None]:
    with monkeypatch.context() as patch:
        patch.setenv(forkserver.ENV_SWITCH, "1" if on else "0")
        yield


# A TLKV reader (pure codec), a decode side (grpc in the child) and a MOQT relay (aioquic, an event loop): mutants,
# each run on the checks its lane names (those fail) and one more check (it passes).
SAME_VERDICTS = {
    "tlkv-reader": ("tests.mutants.tlkv", "SkipsCrcReader", "test_values", TESTBED),
    "tlkv-decode": ("tests.mutants.tlkv", "SkipsChunkCrcDecode", "test_has_blocks_order", TESTBED),
    "moqt-relay": ("tests.mutants.moqt", "OpenPublishNamespaceRelay", "test_the_relay_answers_setup", None),
}


@pytest.mark.slow
@spawn.covering(RUN_BOUND, RUN_BOUND)
@pytest.mark.parametrize("suite", sorted(SAME_VERDICTS))
def test_forked_and_fresh_runs_give_the_same_verdicts(suite: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    module, name, passing, testbed = SAME_VERDICTS[suite]
    mutant = importlib.import_module(module).MUTANTS[name]
    target, checks = f"python:{module}:{name}", (*mutant.checks, passing)
    runs: dict[bool, Run] = {}
    for fork in (True, False):
        with _switched(monkeypatch, fork):
            runs[fork] = run_suite(suite, target, tmp_path / str(fork), checks=checks, testbed=testbed)

    def outcome(doc: dict[str, Any]) -> list[tuple[str, str, str | None, int]]:
        return sorted((t["nodeid"], t["verdict"], t.get("blamed"), t["seed"]) for t in doc["tests"])

    forked, fresh = runs[True], runs[False]
    assert forked.coverage and fresh.coverage, (forked.output, fresh.output)
    assert outcome(forked.coverage) == outcome(fresh.coverage), (forked.output, fresh.output)
    verdicts = {v for _, v, _, _ in outcome(fresh.coverage)}
    assert forked.code == fresh.code == 1 and {"fail", "pass"} <= verdicts, verdicts


def test_a_spawning_test_must_have_the_time_its_runs_may_take() -> None:
    budget = spawn._Budget()
    budget.begin("t::x", 420)
    budget.charge(300)
    with pytest.raises(AssertionError, match=r"mark it @tests.spawn.covering\(300, 300\)"):
        budget.charge(300)
    budget.end()
    budget.charge(10_000)  # outside a test (a script): nothing to cover
    assert spawn.covering(300, 300).kwargs == {} and spawn.covering(300, 300).args == (math.ceil(660),)

