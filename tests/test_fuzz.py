"""The fuzz lane: every registered parser survives its corpus and a short seeded mutation run, and the
engines do fail on deliberately broken toy parsers (a crash, a hang, a hang no timer reaches, a memory
blow-up, a dying process), so a clean run means something."""

from __future__ import annotations

import importlib.util
import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvconform.fuzz.corpus import committed_corpus_dir, load_corpus
from kvconform.fuzz.engine import Engine, FuzzConfig
from kvconform.fuzz.finding import Finding
from kvconform.fuzz.mutate import Mutator
from kvconform.fuzz.registry import KNOWN_FAILING, all_targets, resolve
from kvconform.fuzz.splits import feed_compare, split_points
from kvconform.fuzz.target import FuzzTarget, OracleError
from kvconform.fuzz.tool import main as fuzz_main
from kvconform.fuzz.toys import triggered
from kvconform.moqt.errors import MoqtDecodeError

SEED = 20260601
# Per parser: a fixed input budget keeps CI reproducible; the time cap only guards a slow machine.
CI_INPUTS = 3000
CI_SECONDS = 6.0


def _quiet(line: str) -> None:
    pass


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    config = FuzzConfig(seconds=CI_SECONDS, seed=SEED, max_inputs=CI_INPUTS, timeout=2.0, progress=60.0)
    with Engine(config, tmp_path_factory.mktemp("fuzz"), _quiet) as e:
        yield e


def _describe(findings: list[Finding], saved: dict[str, Path]) -> str:
    return "\n".join(f"{f.signature}: {f.error}\n  input {f.input_hex[:120]}\n  replay: kvconform fuzz {f.parser} "
                     f"--replay {saved.get(f.signature)}\n{f.traceback}" for f in findings)


@pytest.mark.parametrize("name", list(all_targets()))
def test_parser_survives_corpus_and_mutations(engine: Engine, name: str) -> None:
    if name in KNOWN_FAILING:
        pytest.skip(KNOWN_FAILING[name])
    target = resolve(name)
    report = engine.run(target)
    assert not report.findings, _describe(report.findings, report.saved)
    assert report.inputs >= min(CI_INPUTS, len(load_corpus(target)) + 1)


def test_committed_corpus_names_registered_parsers() -> None:
    folders = [p.name for p in committed_corpus_dir().iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert folders and set(folders) <= set(all_targets())
    for name in folders:
        files = [p for p in (committed_corpus_dir() / name).iterdir() if p.is_file()]
        assert len(files) <= 48, f"{name}: {len(files)} corpus files; keep a few dozen at most"
        assert all(p.stat().st_size <= 64 * 1024 for p in files)


def test_every_target_has_seeds_and_declares_typed_errors() -> None:
    for target in all_targets().values():
        assert list(target.seeds()), target.name
        assert target.accepts and all(issubclass(e, Exception) for e in target.accepts), target.name
        assert not any(issubclass(OracleError, e) for e in target.accepts), target.name


# ---- the engine can fail -----------------------------------------------------------------------------


def _toy_run(tmp_path: Path, name: str, **bounds: float) -> tuple[list[Finding], dict[str, Path]]:
    """A seeded run of a toy that stops at its first finding (20 s and 20 000 inputs at most)."""
    settings: dict[str, object] = {"seconds": 20.0, "max_inputs": 20000, **bounds}
    config = FuzzConfig(seed=SEED, progress=60.0, with_committed=False, stop_on_finding=True,
                        **settings)  # type: ignore[arg-type]
    with Engine(config, tmp_path, _quiet) as e:
        report = e.run(resolve(name))
    return report.findings, report.saved


def test_engine_finds_a_crash_and_it_replays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    findings, saved = _toy_run(tmp_path, "toy-crash")
    assert [f.kind for f in findings] == ["crash"]
    f = findings[0]
    assert "IndexError" in f.signature and f.seed == SEED and f.source == "mutate" and triggered(f.data)
    path = saved[f.signature]
    assert json.loads(path.read_text())["input_hex"] == f.input_hex
    assert fuzz_main(["toy-crash", "--replay", str(path), "--out", str(tmp_path / "replay")]) == 1
    assert "IndexError" in capsys.readouterr().out
    clean = tmp_path / "clean"
    clean.write_bytes(b"ok fine")
    assert fuzz_main(["toy-crash", "--replay", str(clean), "--out", str(tmp_path / "replay")]) == 0


def test_engine_finds_a_hang(tmp_path: Path) -> None:
    findings, _ = _toy_run(tmp_path, "toy-hang", timeout=0.2)
    assert [(f.kind, "toys.py" in f.signature) for f in findings] == [("hang", True)]


def test_engine_finds_a_hang_no_timer_reaches(tmp_path: Path) -> None:
    findings, _ = _toy_run(tmp_path, "toy-hard-hang", timeout=0.2, watchdog=1.5)
    assert findings and {f.kind for f in findings} == {"hang"}
    assert "worker was killed" in findings[0].error and triggered(findings[0].data)


def test_engine_finds_a_memory_blowup(tmp_path: Path) -> None:
    findings, _ = _toy_run(tmp_path, "toy-memory", memory_mb=256)
    assert [f.kind for f in findings] == ["memory"]
    assert "greedy" in findings[0].signature


def test_engine_survives_a_dying_worker(tmp_path: Path) -> None:
    config = FuzzConfig(seconds=20.0, seed=SEED, max_inputs=5000, progress=60.0, with_committed=False)
    with Engine(config, tmp_path, _quiet) as e:
        report = e.run(resolve("toy-abort"))
    assert report.findings and report.findings[0].kind == "died" and "signal 6" in report.findings[0].error
    assert triggered(report.findings[0].data) and report.restarts >= 1
    assert report.inputs >= 5000  # a fresh worker carried on to the end of the budget


@pytest.mark.skipif(importlib.util.find_spec("atheris") is None, reason="atheris not installed (kvconform[fuzz])")
def test_atheris_engine_finds_a_crash(tmp_path: Path) -> None:
    from kvconform.fuzz.atheris_engine import run_atheris

    config = FuzzConfig(seconds=20.0, seed=SEED, progress=60.0, with_committed=False)
    report = run_atheris(resolve("toy-crash"), config, tmp_path, _quiet)
    assert [f.kind for f in report.findings] == ["crash"] and "IndexError" in report.findings[0].signature


# ---- the pieces -------------------------------------------------------------------------------------


def test_mutator_replays_from_its_seed() -> None:
    target = resolve("moqt-control-message")
    pool = [d for _, d in load_corpus(target)]

    def run(seed: int) -> list[bytes]:
        m = Mutator(target, random.Random(seed), 4096)
        return [m.mutate(pool[i % len(pool)], pool) for i in range(300)]

    assert run(5) == run(5) and run(5) != run(6)
    assert all(len(d) <= 4096 for d in run(5))


class _SplitDependent:
    """A stream parser that (wrongly) emits one event per piece it is fed."""

    def __init__(self) -> None:
        self.n = 0

    def feed(self, data: bytes) -> list[object]:
        self.n += 1
        return [self.n]

    def end_of_stream(self) -> None:
        pass


def test_split_oracle_catches_a_parser_that_depends_on_the_cuts() -> None:
    assert split_points(3, 100) == split_points(3, 100)
    with pytest.raises(OracleError, match="in pieces"):
        feed_compare(_SplitDependent, bytes(100), 3)


def test_split_oracle_reraises_the_typed_error() -> None:
    from kvconform.moqt.data import DataStreamParser

    with pytest.raises(MoqtDecodeError):
        feed_compare(DataStreamParser, bytes([0x7F, 0, 0]), 1)  # 0x7f: not a stream type


def test_cli_list_and_a_short_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert fuzz_main(["list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in all_targets())
    code = fuzz_main(["kbtp-completion-record", "--seconds", "0.5", "--seed", "1", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and "kbtp-completion-record" in out and "seed 1" in out
    assert fuzz_main(["no-such-parser"]) == 2


def test_toy_targets_are_not_registered() -> None:
    assert not any(t.protocol == "toy" for t in all_targets().values())
    assert isinstance(resolve("toy-crash"), FuzzTarget)


def test_answers_seen_stay_small_when_errors_quote_the_input() -> None:
    # A long campaign once ran out of memory: KVCS field names quote track names, and each distinct
    # one was kept whole in the set of answers seen.
    from kvconform.fuzz.worker import _outcome_signature
    from kvconform.kvcs.errors import KvcsError

    sig = _outcome_signature("accepted", KvcsError("manifest tracks." + "k.raw.s-Inf" * 2000, "bad"))
    assert sum(len(str(part)) for part in sig) < 120
