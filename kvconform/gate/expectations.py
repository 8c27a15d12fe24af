"""The expectations file of ``kvconform gate --baseline FILE``: the verdicts a vendor expects (its known
failures, with a reason and an optional expiry), schema-checked (expectations.schema.json) with errors naming the
entry and the field.

    format: kvconform-expectations/1
    expectations:
      - requirement: TLKV-READ-CRC          # or check: <check id>, a * in it matches several
        verdict: fail
        reason: CRC verification lands in 2.4 (ticket 812)
        expires: 2027-03-31                 # optional; from that day on it excuses nothing
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from kvconform.results import NOT_REACHED, TestResult
from kvconform.yamlload import YAMLError, safe_load

__all__ = ["FORMAT", "Expectation", "Expectations", "ExpectationsError", "load_expectations"]

FORMAT = "kvconform-expectations/1"


def _pattern(check: str) -> re.Pattern[str]:
    # only * is special: check ids are full of [ and ] (parameters), which fnmatch would read as sets
    return re.compile(".*".join(re.escape(part) for part in check.split("*")))


class ExpectationsError(ValueError):
    """An expectations file that cannot be used; the message names the file, the entry and the field."""


@dataclass(frozen=True)
class Expectation:
    """One entry: a check (or pattern) or a requirement, the verdict expected, why, until when.

    A check entry judges each check it names; a requirement entry judges the requirement (the worst of its checks'
    verdicts for it, by the blame rule): it excuses the checks that fail that requirement, and it is an unexpected
    pass when none does."""

    index: int
    verdict: str
    reason: str
    check: str | None = None
    requirement: str | None = None
    expires: dt.date | None = None

    @property
    def subject(self) -> str:
        return self.check if self.check is not None else f"requirement {self.requirement}"

    def expired(self, today: dt.date) -> bool:
        return self.expires is not None and today >= self.expires

    def verdict_of(self, result: TestResult) -> str | None:
        """The check's verdict as this entry judges it (a requirement: by the blame rule), None if it does not
        apply to the check."""
        if self.check is not None:
            if result.nodeid == self.check or ("*" in self.check and _pattern(self.check).fullmatch(result.nodeid)):
                return result.verdict
            return None
        if self.requirement in result.reqs:
            verdict = result.verdict_for(self.requirement)
            # a check that failed on another requirement says nothing of this one: the entry does not excuse it
            return None if verdict == NOT_REACHED else verdict
        return None


@dataclass(frozen=True)
class Expectations:
    """A loaded expectations file."""

    path: str
    entries: tuple[Expectation, ...]

    def check_entry(self, result: TestResult) -> Expectation | None:
        """The first check entry naming this check."""
        return next((e for e in self.entries if e.check is not None and e.verdict_of(result) is not None), None)

    def requirement_entries(self, result: TestResult) -> list[tuple[Expectation, str]]:
        """The requirement entries that speak of this check, each with the check's verdict for its requirement."""
        out = []
        for entry in self.entries:
            if entry.requirement is not None:
                verdict = entry.verdict_of(result)
                if verdict is not None:
                    out.append((entry, verdict))
        return out


def _schema() -> dict[str, Any]:
    text = resources.files("kvconform.gate").joinpath("expectations.schema.json").read_text("utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _where(error: jsonschema.ValidationError) -> str:
    out = ""
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _message(error: jsonschema.ValidationError) -> str:
    if error.validator == "oneOf" and isinstance(error.instance, dict):
        both = "check" in error.instance and "requirement" in error.instance
        return ("has both check and requirement; give one" if both
                else "names neither a check nor a requirement; give check: or requirement:")
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        schema = error.schema if isinstance(error.schema, dict) else {}
        known = sorted(schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(known))
        return f"unknown field {', '.join(extra)}; the fields are {', '.join(known)}"
    return error.message


def load_expectations(path: str | os.PathLike[str]) -> Expectations:
    """Read and check an expectations file."""
    where = Path(path)
    try:
        doc = safe_load(where.read_bytes())
    except OSError as exc:
        raise ExpectationsError(f"{where}: cannot read: {exc.strerror or exc}") from None
    except YAMLError as exc:
        raise ExpectationsError(f"{where}: not YAML: {exc}") from None
    if isinstance(doc, dict) and isinstance(doc.get("expectations"), list):
        # YAML reads an unquoted 2027-03-31 as a date; the schema checks the text
        for entry in doc["expectations"]:
            if isinstance(entry, dict) and isinstance(entry.get("expires"), dt.date):
                entry["expires"] = entry["expires"].isoformat()
    validator = jsonschema.Draft202012Validator(_schema(), format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
        raise ExpectationsError(f"{where}: {_where(first)}: {_message(first)}{more}")
    entries = []
    for n, raw in enumerate(doc["expectations"]):
        expires = dt.date.fromisoformat(raw["expires"]) if "expires" in raw else None
        entries.append(Expectation(index=n, verdict=raw["verdict"], reason=raw["reason"], check=raw.get("check"),
                                   requirement=raw.get("requirement"), expires=expires))
    return Expectations(str(where), tuple(entries))
