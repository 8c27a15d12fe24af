"""What a cell's exchange works with: its context (folder, seed, participants, records) and how it ends.

An exchange returns normally when it completed and was verified, or raises one of ``Unavailable`` (a
participant could not be started or reached: inconclusive), ``Unobservable`` (what must be verified cannot
be seen: inconclusive) or ``Broken`` (a participant broke it: fail, with the suspects).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvconform import evidence
from kvconform.matrix.participants import target_spec
from kvconform.matrix.registry import RunForm
from kvconform.targets.spec import TargetSpec

__all__ = ["NOT_STARTED", "Broken", "CellContext", "Participant", "Unavailable", "Unobservable"]

NOT_STARTED = (126, 127)  # the shell's "not executable" / "command not found"
DOCKER_NOT_STARTED = (125, 126, 127)  # docker run: 125 the daemon could not run the container; 126/127 its command


class Unavailable(Exception):
    """A participant could not be started or reached before anything was exchanged (inconclusive)."""

    def __init__(self, suite: str, message: str) -> None:
        super().__init__(message)
        self.suite = suite


class Unobservable(Exception):
    """The exchange ran, but what it needs to be verified cannot be seen (inconclusive, never pass)."""


class Broken(Exception):
    """The exchange failed; ``suspects`` are the roles the evidence points at."""

    def __init__(self, suspects: Sequence[str], message: str) -> None:
        super().__init__(message)
        self.suspects = list(suspects)


@dataclass
class Participant:
    """One participant of the cell: its registry entry for the role it plays here."""

    suite: str
    implementation: str
    run: RunForm
    pics: dict[str, Any]
    versions: list[Any]
    reference: bool

    @classmethod
    def from_request(cls, suite: str, data: dict[str, Any]) -> Participant:
        form = RunForm.from_dict(data["run"])
        return cls(suite, data["implementation"], form, dict(data.get("pics", {})), list(data.get("versions", [])),
                   bool(data.get("reference")))


@dataclass
class CellContext:
    """What an exchange works with: the cell's folder, seed, participants, and what it records."""

    id: str
    dir: Path
    seed: int
    participants: dict[str, Participant]
    registry_dir: Path
    budget_s: float
    run: str = ""  # the matrix run's id (labels its containers)
    steps: list[dict[str, Any]] = field(default_factory=list)
    exchanged: dict[str, Any] = field(default_factory=dict)
    identifiers: dict[str, Any] = field(default_factory=dict)
    logs: dict[str, list[str]] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    @property
    def rng(self) -> random.Random:
        return random.Random(self.seed)

    def part(self, suite: str) -> Participant:
        return self.participants[suite]

    def spec(self, suite: str) -> TargetSpec:
        """The TargetSpec of the participant playing ``suite`` (an ``image:`` a docker target of the contract, a
        ``cmd:`` in ``docker:`` its ``docker run``; containers labelled with the cell and the run)."""

        p = self.participants[suite]
        return target_spec(p.implementation, suite, p.run, p.pics, mounts=[self.dir], cell=self.id,
                           registry_dir=self.registry_dir, run=self.run)

    def not_started(self, suite: str, code: int | None) -> bool:
        """Whether exit status ``code`` of the participant playing ``suite`` says it could not be run at all
        (the cell is then inconclusive: nothing of it was exchanged, nobody is blamed)."""
        return code in (DOCKER_NOT_STARTED if self.participants[suite].run.in_docker else NOT_STARTED)

    def step(self, what: str, **fields: Any) -> None:
        """One step of the exchange, in order, with the time since the cell started."""
        self.steps.append({"t": round(time.monotonic() - self.started, 3), "what": what, **fields})
        evidence.note(f"{what}: {json.dumps(fields, default=str)[:2000]}")

    def log(self, suite: str, title: str, text: str) -> None:
        """Append to the participant's log (what it printed, how it ended)."""
        self.logs.setdefault(suite, []).append(f"==== {title}\n{text.rstrip()}\n")

    def log_process(self, suite: str, title: str, result: dict[str, Any]) -> None:
        """A ``ProcessResult.evidence()``-shaped record as a log section."""
        self.log(suite, f"{title}: argv {result.get('argv')} exit {result.get('returncode')}"
                        f"{' (stopped at its bound)' if result.get('timed_out') else ''}",
                 f"---- stdout\n{result.get('stdout', '')}\n---- stderr\n{result.get('stderr', '')}")
