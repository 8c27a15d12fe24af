"""Verdicts the writer and reader suites give spawned (cmd:) implementations written for these tests from the
seed text alone (scripts/writer.py, scripts/reader.py), end to end through `kvconform run` (issue 10):

- a correct writer passes whatever its process habits (non-UTF-8 stderr, a child holding stdout, children,
  a daemon, a child ignoring SIGTERM), and no process of any of them is left after the run; one that hangs
  fails, bounded by --timeout, and leaves nothing behind either, even ignoring SIGTERM;
- a v1-only reader that reports its allocations passes, the v1-only check included; one that does not report
  them leaves the allocation checks inconclusive, with the reason, and passes the rules.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.spawn import covering
from tests.tlkv.harness import PY, SCRIPTS, SMALL, kvconform_run

LEAK_ENV = "KVCONFORM_TLKV_TEST_TAG"
WRITER_CHECKS = "B16-tail15-v1 and (test_size or test_crc or test_fills or test_block_hashes)"
CORRECT_HABITS = ["none", "stderr-garbage", "child-holds-stdout", "forks", "daemonises", "ignores-sigterm"]


def _writer(habit: str, tag: str) -> str:
    return (f"cmd:env {LEAK_ENV}={tag} {PY} {SCRIPTS / 'writer.py'} --sequence {{sequence}} --out {{out}} "
            f"--habit {habit}")


def _tagged(tag: str) -> list[int]:
    """Live processes carrying this test's tag in their environment: what a run left behind."""
    needle = f"{LEAK_ENV}={tag}".encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.slow
@covering(180)
@pytest.mark.parametrize("habit", CORRECT_HABITS)
def test_correct_writer_passes_whatever_its_process_habits(habit: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    run = kvconform_run("tlkv-writer", _writer(habit, tag), tmp_path, "-k", WRITER_CHECKS,
                        pics=("tlkv.writer.versions=[1]",), timeout=180)
    assert run.code == 0, run.describe()
    assert set(run.verdicts) == {"pass"} and sum(run.verdicts.values()) >= 4, run.describe()
    assert not _tagged(tag), f"processes of the {habit} writer left behind: {_tagged(tag)}"


@pytest.mark.slow
@covering(120)
@pytest.mark.parametrize("habit", ["hangs", "hangs-ignoring-sigterm"])
def test_hanging_writer_fails_and_leaves_nothing(habit: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    run = kvconform_run("tlkv-writer", _writer(habit, tag), tmp_path, "--timeout", "5", "-k",
                        "test_size and B16-exact-v1", pics=("tlkv.writer.versions=[1]",), timeout=120)
    assert run.code == 1, run.describe()
    assert dict(run.verdicts) == {"fail": 1}, run.describe()
    assert "hung" in run.tests[0]["message"] and run.tests[0]["blamed"] == "TLKV-ENV-SIZE", run.describe()
    assert not _tagged(tag), f"processes of the {habit} writer left behind: {_tagged(tag)}"


def _reader(*flags: str) -> str:
    return (f"cmd:{PY} {SCRIPTS / 'reader.py'} --envelope {{envelope}} --pool {{pool}} --versions {{versions}} "
            f"--out {{out}} {' '.join(flags)}")


# Every reader check but the 300-case fuzz (a process per case).
READER_CHECKS = "test_rule or test_v1_only or test_values or test_reads_both or test_vector"
V1_ONLY_READER = ("tlkv.reader.versions=[1]", f"tlkv.reader.geometry={SMALL}", "tlkv.reader.v1_only_mode=false")


@pytest.mark.slow
@covering(240)
def test_v1_only_reader_reporting_allocations_passes(tmp_path: Path) -> None:
    run = kvconform_run("tlkv-reader", _reader(), tmp_path, "-k", READER_CHECKS, pics=V1_ONLY_READER, timeout=240)
    assert run.code == 0, run.describe()
    assert set(run.verdicts) == {"pass", "not-applicable"}, run.describe()
    assert run.verdict_of("test_v1_only_reader_refuses_v2_cleanly") == "pass", run.describe()
    assert "test_rule_allocates_nothing[last-of-three-bad-v1]" in run.with_verdict("pass"), run.describe()
    # v2 is not declared: every v2 case is not-applicable, none runs; so is a generated value class that does not
    # exist at the small geometry (n_kv_heads 1 - 1 is the zero class already).
    absent = {t["nodeid"].split("::")[-1] for t in run.tests if "does not exist at the declared" in t["message"]}
    assert all(n.endswith("-v2]") or "[2]" in n or "vector" in n or "reads_both" in n or n in absent
               for n in run.with_verdict("not-applicable")), run.describe()


@pytest.mark.slow
@covering(240)
def test_reader_silent_about_allocations_is_inconclusive_there(tmp_path: Path) -> None:
    run = kvconform_run("tlkv-reader", _reader("--silent-allocations"), tmp_path, "-k", "test_rule",
                        pics=V1_ONLY_READER, timeout=240)
    alloc = [t for t in run.tests if "allocates_nothing" in t["nodeid"] and t["verdict"] != "not-applicable"]
    rules = [t for t in run.tests if "allocates_nothing" not in t["nodeid"] and t["verdict"] != "not-applicable"]
    assert alloc and all(t["verdict"] == "inconclusive" and "does not report what it allocated" in t["message"]
                         for t in alloc), run.describe()
    assert rules and all(t["verdict"] == "pass" for t in rules), run.describe()
    assert run.code == 1, "an inconclusive mandatory check gates: allocation was not shown"
