"""Mutation testing of the reference's pure cores against the conformance suites (issue 11, item 3).

Each module of a core is mutated by cosmic-ray (the `mutation` extra) in a throw-away copy of the checkout
outside the repository, and every mutant is run against that core's conformance SUITES with the mutated
reference as the target (pytest with the kvconform plugin, `--kvconform-strict`, `-x`): a mutant is killed
when the suite run fails (exit status non-zero: a failed or inconclusive gating check, or the run's bound ran
out), and survives when every suite still passes. The harness shares the cores it tests (the KBTP suites
encode their requests with kvconform.kbtp.messages, the TLKV suites build envelopes with the reference
writer), so a mutation of a shared codec changes both sides; the suites' vectors are what catch those.

    nice -n 19 python tools/mutation.py run kbtp --budget 1800 --sample 40 --seed 11
    python tools/mutation.py report          # docs/mutation.md from docs/mutation-results.json + triage
    tox -e mutation                          # every core, default budget and sampling, then the report

A module with more mutants than `--sample` runs a sample of that many, drawn with `--seed` (the results say
so); `--budget` bounds each module's wall time, and mutants the budget left unrun are counted as such.
Results are merged into docs/mutation-results.json per module, so cores can be run one at a time; the triage
of survivors (equivalent, with the reason, or killed by a new check) is data, tools/mutation_triage.yaml,
keyed by module, line and the mutated line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "mutation-results.json"
TRIAGE = ROOT / "tools" / "mutation_triage.yaml"
DOC = ROOT / "docs" / "mutation.md"
DEFAULT_WORK = Path(os.environ.get("TMPDIR", "/tmp")) / "kvconform-mutation"


@dataclass(frozen=True)
class Core:
    """A pure core: its modules and the conformance suites (folders under conformance/) run against it."""

    modules: tuple[str, ...]
    suites: tuple[str, ...]
    timeout: float  # per mutant: a mutant that makes the suites run longer is killed ("timeout")


CORES: Mapping[str, Core] = {
    "tlkv": Core(("kvconform/tlkv/envelope.py", "kvconform/tlkv/reader.py", "kvconform/tlkv/decode.py"),
                 ("conformance/tlkv",), 120),
    "kbtp": Core(("kvconform/kbtp/ring.py", "kvconform/kbtp/freering.py", "kvconform/kbtp/table.py",
                  "kvconform/kbtp/messages.py", "kvconform/kbtp/target.py"),
                 ("conformance/kbtp",), 120),
    "kvcs": Core(("kvconform/kvcs/payload.py", "kvconform/kvcs/manifest.py"), ("conformance/kvcs",), 240),
    "moqt": Core(("kvconform/moqt/vi64.py", "kvconform/moqt/messages.py", "kvconform/moqt/data.py"),
                 ("conformance/moqt", "conformance/kvcs"), 300),
}


def test_command(core: Core, python: str = sys.executable) -> str:
    """The suites of `core` against the reference: strict (SHOULD failures count), stop at the first failure,
    fixed order and seed, each check bounded."""
    return shlex.join([python, "-m", "pytest", *core.suites, "-x", "-q", "-p", "no:randomly", "-p", "no:xdist",
                       "--kvconform-target", "reference", "--kvconform-strict", "--kvconform-seed", "20261129",
                       "--timeout", "60"])


# --- results: what `cosmic-ray dump` prints, summarised (pure: unit-tested in tests/test_mutation_tool.py) ---

@dataclass(frozen=True)
class Mutant:
    module: str
    line: int
    operator: str
    occurrence: int
    outcome: str  # killed | survived | timeout | incompetent | not-sampled | not-run | no-test
    diff: str = ""

    @property
    def change(self) -> str:
        """The mutated line as the diff shows it ('-old' -> '+new'), for the report and the triage key."""
        minus = [ln[1:].strip() for ln in self.diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
        plus = [ln[1:].strip() for ln in self.diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
        return f"{' / '.join(minus)} -> {' / '.join(plus)}" if minus or plus else self.operator

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "operator": self.operator, "occurrence": self.occurrence,
                "outcome": self.outcome, "change": self.change}


def outcome_of(result: Mapping[str, Any] | None) -> str:
    """One cosmic-ray WorkResult (as dumped) -> our outcome word."""
    if result is None:
        return "not-run"
    worker = result.get("worker_outcome")
    if worker == "skipped":
        return "not-sampled"
    if worker == "no-test":
        return "no-test"
    if worker in ("exception", "abnormal"):
        return "incompetent"
    test = result.get("test_outcome")
    if test == "killed":
        return "timeout" if (result.get("output") or "") == "timeout" else "killed"
    if test == "survived":
        return "survived"
    return "incompetent"


def parse_dump(lines: Iterable[str]) -> list[Mutant]:
    """The lines of `cosmic-ray dump` (one JSON [work_item, result|null] per line) -> mutants."""
    out: list[Mutant] = []
    for raw in lines:
        if not raw.strip():
            continue
        item, result = json.loads(raw)
        spec = item["mutations"][0]
        out.append(Mutant(module=str(spec["module_path"]), line=int(spec["start_pos"][0]),
                          operator=str(spec["operator_name"]), occurrence=int(spec["occurrence"]),
                          outcome=outcome_of(result), diff=str((result or {}).get("diff") or "")))
    return out


@dataclass
class Summary:
    module: str
    generated: int = 0
    run: int = 0
    killed: int = 0
    survived: int = 0
    timeout: int = 0
    incompetent: int = 0
    not_sampled: int = 0
    not_run: int = 0
    survivors: list[dict[str, Any]] = field(default_factory=list)

    @property
    def score(self) -> float | None:
        """Killed (timeouts included) over the mutants that ran to a verdict; None when none did."""
        judged = self.killed + self.timeout + self.survived
        return (self.killed + self.timeout) / judged if judged else None

    def to_json(self) -> dict[str, Any]:
        return {"module": self.module, "generated": self.generated, "run": self.run, "killed": self.killed,
                "survived": self.survived, "timeout": self.timeout, "incompetent": self.incompetent,
                "not_sampled": self.not_sampled, "not_run": self.not_run, "survivors": self.survivors}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Summary:
        return cls(**{k: doc[k] for k in ("module", "generated", "run", "killed", "survived", "timeout",
                                          "incompetent", "not_sampled", "not_run", "survivors")})


def summarise(module: str, mutants: Sequence[Mutant]) -> Summary:
    s = Summary(module=module, generated=sum(m.outcome != "no-test" for m in mutants))
    for m in mutants:
        if m.outcome == "no-test":
            continue
        if m.outcome == "not-sampled":
            s.not_sampled += 1
        elif m.outcome == "not-run":
            s.not_run += 1
        else:
            s.run += 1
            setattr(s, m.outcome, getattr(s, m.outcome) + 1)
            if m.outcome == "survived":
                s.survivors.append(m.to_json())
    s.survivors.sort(key=lambda d: (d["line"], d["operator"], d["occurrence"]))
    return s


def triage_key(module: str, survivor: Mapping[str, Any]) -> str:
    return f"{module}:{survivor['line']}:{survivor['change']}"


def render(runs: Mapping[str, Mapping[str, Any]], triage: Mapping[str, str]) -> str:
    """docs/mutation.md from the merged results (module -> {summary, command, sampled, ...}) and the triage."""
    out = ["# Mutation score of the reference cores against the conformance suites", "",
           "Generated by `python tools/mutation.py report` (tox -e mutation runs the cores first); do not edit: "
           "the numbers come from docs/mutation-results.json, the survivor notes from tools/mutation_triage.yaml.",
           "", "A mutant (cosmic-ray, its default operators) of one reference module is *killed* when the "
           "conformance suites of its core, run with the mutated reference as the target, fail (`--strict`, "
           "first failure stops the run); *timeout* counts as killed (the suites' bound ran out). Score = "
           "(killed + timeout) / (killed + timeout + survived). *Not sampled*: generated but outside the seeded "
           "sample; *not run*: the module's time budget ran out first; *incompetent*: the mutant could not run "
           "(not counted).", "",
           "The suites share some of the cores they test (the KBTP harness encodes its requests with "
           "kvconform.kbtp.messages, the TLKV reader suite builds its malformed envelopes with the reference "
           "writer): a mutant of a shared codec changes both sides, and the suites' committed vectors are what "
           "catch it. A survivor is triaged as *equivalent* (behaves as the reference on every input the role's "
           "interface can give it, with the reason), *outside the suites' reach* (code a black-box suite cannot "
           "drive: the reference's own introspection, the vector generator, library entry points no role "
           "exposes; a real survivor, not counted as equivalent), or a *gap handed to* a suite (the scenario or "
           "assertion that would kill it).", "",
           "*Equivalent*: survivors the triage shows to behave as the reference on every input the text allows; "
           "*score without equivalents* = (killed + timeout) / (killed + timeout + survived - equivalent).", "",
           "| module | generated | run | killed | timeout | survived | equivalent | incompetent | not sampled | "
           "not run | score | score without equivalents |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for module in sorted(runs):
        s = Summary.from_json(runs[module]["summary"])
        equivalent = sum(triage.get(triage_key(module, sv), "").startswith("equivalent") for sv in s.survivors)
        caught, judged = s.killed + s.timeout, s.killed + s.timeout + s.survived
        out.append(f"| `{module}` | {s.generated} | {s.run} | {s.killed} | {s.timeout} | {s.survived} | {equivalent} | "
                   f"{s.incompetent} | {s.not_sampled} | {s.not_run} | {_percent(caught, judged)} | "
                   f"{_percent(caught, judged - equivalent)} |")
    if runs:
        tot = [Summary.from_json(runs[m]["summary"]) for m in runs]
        equivalent = sum(triage.get(triage_key(s.module, sv), "").startswith("equivalent")
                         for s in tot for sv in s.survivors)
        caught = sum(s.killed + s.timeout for s in tot)
        judged = caught + sum(s.survived for s in tot)
        out.append(f"| all | {sum(s.generated for s in tot)} | {sum(s.run for s in tot)} | "
                   f"{sum(s.killed for s in tot)} | {sum(s.timeout for s in tot)} | {sum(s.survived for s in tot)} | "
                   f"{equivalent} | {sum(s.incompetent for s in tot)} | {sum(s.not_sampled for s in tot)} | "
                   f"{sum(s.not_run for s in tot)} | {_percent(caught, judged)} | "
                   f"{_percent(caught, judged - equivalent)} |")
    missing = [m for core in CORES.values() for m in core.modules if m not in runs]
    if missing:
        out += ["", "Not run yet (no result): " + ", ".join(f"`{m}`" for m in missing) + "."]
    out += ["", "## How each module was run", ""]
    for module in sorted(runs):
        r = runs[module]
        redraw = ("" if r.get("sample_order") == "mutation" or not r.get("sample") else
                  " (drawn by cosmic-ray's random job ids, before the sample was ordered by mutation: the seed does "
                  "not redraw it)")
        invocation = f"`nice -n 19 {r['invocation']}` ran " if r.get("invocation") else ""
        out.append(f"- `{module}`: {invocation}{r['how']}{redraw}, {r['finished']}; each mutant: `{r['command']}`")
    out += ["", "## Survivors", ""]
    untriaged = 0
    for module in sorted(runs):
        s = Summary.from_json(runs[module]["summary"])
        if not s.survivors:
            continue
        out += [f"### `{module}`", ""]
        for sv in s.survivors:
            note = triage.get(triage_key(module, sv))
            if note is None:
                untriaged += 1
            out.append(f"- `{module}:{sv['line']}` ({sv['operator']} #{sv['occurrence']}): `{sv['change']}` — "
                       f"{note or 'untriaged'}")
        out.append("")
    if untriaged:
        out += [f"{untriaged} survivor(s) untriaged.", ""]
    gaps = [(module, sv, triage[triage_key(module, sv)]) for module in sorted(runs)
            for sv in Summary.from_json(runs[module]["summary"]).survivors
            if "gap handed to" in triage.get(triage_key(module, sv), "")]
    if gaps:
        out += ["## Gaps handed to the suites", "",
                "Survivors that a black-box suite could kill with a scenario or an assertion it does not have yet "
                "(the suites belong to their lanes; each entry names the suite, the requirement and what kills it):",
                ""]
        out += [f"- `{module}:{sv['line']}` `{sv['change']}`: {note}" for module, sv, note in gaps]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f} %" if whole > 0 else "—"


def load_triage(path: Path = TRIAGE) -> dict[str, str]:
    import yaml

    if not path.exists():
        return {}
    doc = yaml.safe_load(path.read_text()) or {}
    return {str(k): str(v) for k, v in doc.items()}


def load_results(path: Path = RESULTS) -> dict[str, dict[str, Any]]:
    return dict(json.loads(path.read_text())) if path.exists() else {}


# --- running (needs the `mutation` extra: cosmic-ray) ---

def _copy_checkout(dest: Path) -> None:
    """The checkout's files (tracked and untracked-not-ignored, symlinks kept) into `dest`, compiled, so the
    test runs (which cosmic-ray runs without writing bytecode) recompile only the mutated module."""
    if dest.exists():
        shutil.rmtree(dest)
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src, dst = ROOT / name, dest / name
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the work tree
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)
    subprocess.run([sys.executable, "-m", "compileall", "-q", "kvconform", "conformance", "fixtures", "targets",
                    "reports"], cwd=dest, check=False, capture_output=True)


def _env(copy: Path, bytecode: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    # the copy's kvconform, not the editable install's: its checkout-site maps the copy's folders into the package
    env["PYTHONPATH"] = os.pathsep.join([str(copy / "tools" / "checkout-site"), str(copy)])
    if not bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run_group(cmd: list[str], cwd: Path, env: Mapping[str, str], timeout: float) -> tuple[int | None, str]:
    """Run `cmd` in its own session; on timeout kill the whole group. (returncode or None, output tail)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=max(timeout, 1))
        return proc.returncode, out.decode(errors="replace")[-4000:]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out.decode(errors="replace")[-4000:]


def _sample(session: Path, size: int, seed: int) -> int:
    """Mark all but a seeded sample of `size` pending mutants skipped; returns how many were skipped."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    with use_db(str(session), WorkDB.Mode.open) as db:
        # Ordered by what each mutant is (job ids are random per init), so a seed draws the same sample again.
        items = sorted(db.pending_work_items, key=lambda w: [(str(m.module_path), m.operator_name, m.occurrence)
                                                             for m in w.mutations])
        if len(items) <= size:
            return 0
        keep = {w.job_id for w in random.Random(seed).sample(items, size)}
        skipped = [w.job_id for w in items if w.job_id not in keep]
        db.set_multiple_results(skipped, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
        return len(skipped)


def run_module(core_name: str, module: str, *, work: Path, budget: float, sample: int, seed: int,
               cosmic_ray: str) -> dict[str, Any]:
    core = CORES[core_name]
    slug = module.replace("/", "_").removesuffix(".py")
    copy = work / slug / "src"
    _copy_checkout(copy)
    command = test_command(core)
    session = work / slug / "session.sqlite"
    config = work / slug / "config.toml"
    session.unlink(missing_ok=True)
    config.write_text(
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(module)}\n"
        f"timeout = {core.timeout}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(command)}\n"
        "[cosmic-ray.distributor]\nname = \"local\"\n")
    started = time.monotonic()
    code, out = _run_group([cosmic_ray, "init", str(config), str(session)], copy, _env(copy, True), 300)
    if code != 0:
        raise SystemExit(f"cosmic-ray init failed for {module}:\n{out}")
    # Baseline, unmutated, writing bytecode and pytest's rewrite caches the mutant runs then read.
    code, out = _run_group(shlex.split(command), copy, _env(copy, True), core.timeout)
    if code != 0:
        raise SystemExit(f"the suites fail against the unmutated reference ({module}); no mutation run:\n{out}")
    baseline = time.monotonic() - started
    skipped = _sample(session, sample, seed) if sample else 0
    left = budget - (time.monotonic() - started)
    code, out = _run_group([cosmic_ray, "exec", str(config), str(session)], copy, _env(copy, False), left)
    elapsed = time.monotonic() - started
    dump = subprocess.run([cosmic_ray, "dump", str(session)], cwd=copy, env=_env(copy, True), check=True,
                          capture_output=True, text=True).stdout
    (work / slug / "dump.jsonl").write_text(dump)
    summary = summarise(module, parse_dump(dump.splitlines()))
    how = f"seeded sample of {sample} of {summary.generated} (seed {seed})" if skipped else f"all {summary.generated}"
    finished = (f"budget {budget:.0f} s ran out after {summary.run} mutants" if code is None
                else f"{elapsed:.0f} s (baseline and setup {baseline:.0f} s)")
    return {"summary": summary.to_json(), "command": command.replace(sys.executable, "python"), "how": how,
            "finished": finished, "seed": seed, "sample": sample, "budget": budget, "sample_order": "mutation"}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="mutate the modules of cores and run their suites")
    run.add_argument("cores", nargs="*", default=sorted(CORES), help=f"cores ({', '.join(CORES)}; default all)")
    run.add_argument("--module", action="append", default=[], help="only these modules (paths as in CORES)")
    run.add_argument("--budget", type=float, default=1200, help="seconds per module (default 1200)")
    run.add_argument("--sample", type=int, default=60, help="mutants per module, seeded sample; 0 = all")
    run.add_argument("--seed", type=int, default=11)
    run.add_argument("--work", type=Path, default=DEFAULT_WORK, help=f"working copies (default {DEFAULT_WORK})")
    beside = Path(sys.executable).parent / "cosmic-ray"
    run.add_argument("--cosmic-ray", default=str(beside) if beside.exists() else shutil.which("cosmic-ray"),
                     help="the cosmic-ray command (default: the one beside this Python)")
    sub.add_parser("report", help="write docs/mutation.md from docs/mutation-results.json and the triage")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        work: Path = args.work.resolve()
        if work.is_relative_to(ROOT):
            ap.error("--work must be outside the checkout (mutant copies are never committed)")
        for name in args.cores:
            if name not in CORES:
                ap.error(f"unknown core {name!r}")
            for module in CORES[name].modules:
                if args.module and module not in args.module:
                    continue
                print(f"mutation: {module} ...", flush=True)
                entry = run_module(name, module, work=work, budget=args.budget, sample=args.sample,
                                   seed=args.seed, cosmic_ray=str(Path(args.cosmic_ray).absolute()))
                entry["invocation"] = shlex.join(["python", "tools/mutation.py", "run", name, "--module", module,
                                                  "--sample", str(args.sample), "--budget", f"{args.budget:g}",
                                                  "--seed", str(args.seed)])
                results = load_results()
                results[module] = entry
                RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
                s = Summary.from_json(entry["summary"])
                print(f"mutation: {module}: run {s.run}, killed {s.killed}, timeout {s.timeout}, survived "
                      f"{s.survived}, score {s.score}", flush=True)
    DOC.write_text(render(load_results(), load_triage()))
    print(f"mutation: wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
