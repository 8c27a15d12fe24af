"""``kvconform report {html,facing,sign,verify,keygen}``: the coverage page rebuilt from a coverage.json, the
certification merged from the paths to one device (verbs and the wires facing it), and a report folder's SHA-256
manifest signed and verified (the arguments are parsed by the CLI)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kvconform.argtypes import USAGE_ERROR
from kvconform.catalog import load_catalogs
from kvconform.reports.certification import certify
from kvconform.reports.coverage import build_coverage, load_coverage, write_coverage_json
from kvconform.reports.facing import merged_report, path_of, read_path
from kvconform.reports.html import write_html
from kvconform.reports.manifest import ManifestError
from kvconform.reports.signature import generate_key, sign, verify
from kvconform.results import TestResult

__all__ = ["ReportUsageError", "main"]


class ReportUsageError(Exception):
    """A ``kvconform report`` command line that cannot be carried out (exit status 2)."""


def main(args: argparse.Namespace) -> int:
    """Run one ``kvconform report`` command; a usage problem is printed and is exit status 2."""
    try:
        return _report(args)
    except ReportUsageError as exc:
        print(f"kvconform: error: {exc}", file=sys.stderr)
        return USAGE_ERROR


def _report(args: argparse.Namespace) -> int:
    if args.report_kind == "sign":
        return _report_sign(args)
    if args.report_kind == "verify":
        return _report_verify(args)
    if args.report_kind == "facing":
        return _report_facing(args)
    if args.report_kind == "keygen":

        try:
            key, pub = generate_key(args.key, args.algorithm)
        except OSError as exc:
            raise ReportUsageError(f"--key {args.key}: cannot write: {exc.strerror or exc}") from None
        print(f"kvconform: private key: {key}\nkvconform: public key: {pub}")
        return 0
    return _report_html(args)


def _report_sign(args: argparse.Namespace) -> int:

    try:
        out = sign(args.report_dir, args.key)
    except ManifestError as exc:
        print(f"kvconform: error: {exc}", file=sys.stderr)
        return 1
    print(f"kvconform: signature: {out}")
    return 0


def _report_verify(args: argparse.Namespace) -> int:

    try:
        result = verify(args.report_dir, args.pub)
    except ManifestError as exc:
        print(f"kvconform: error: {exc}", file=sys.stderr)
        return 1
    for line in result.lines():
        print(f"kvconform: {line}")
    verdict = "matches its manifest" if result.ok else "does NOT match its manifest or signature"
    print(f"kvconform: {args.report_dir} {verdict}")
    return 0 if result.ok else 1


def _report_facing(args: argparse.Namespace) -> int:
    """``kvconform report facing``: the merged certification (kvconform.reports.facing); exit 0 only on PASSED."""
    try:
        primary_doc = load_coverage(Path(args.primary) / "coverage.json")
    except (OSError, ValueError) as exc:
        raise ReportUsageError(f"--primary {args.primary}: {exc}") from exc
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = primary_doc.get("meta", {}).get("target", {})
    name = args.primary_name or str(target.get("name") or target.get("value") or args.primary)
    primary = path_of(primary_doc, name, os.path.relpath(os.path.abspath(args.primary), os.path.abspath(out)))
    paths = []
    for spec in args.facing:
        wire, eq, where = spec.rpartition("=")
        if not eq or not wire or not where:
            raise ReportUsageError(f"--facing {spec!r}: expected NAME=DIR (the wire's URL, its run's report folder)")
        paths.append(read_path(wire, where, out))
    doc = merged_report(load_catalogs(), primary_doc, primary, paths, strict=bool(primary_doc["meta"].get("strict")),
                        suites=args.suite, report_dir=out)
    write_coverage_json(out / "coverage.json", doc)
    write_html(doc, out / "coverage.html", out)
    print(f"kvconform: {doc['verdict']['text']}")
    print(f"kvconform: coverage.json: {out / 'coverage.json'}")
    return 0 if doc["verdict"]["status"] == "PASSED" else 1


def _report_html(args: argparse.Namespace) -> int:

    try:
        doc = load_coverage(args.source)
    except (OSError, ValueError) as exc:
        raise ReportUsageError(f"--from {args.source}: {exc}") from exc
    if args.all_protocols:

        results = [TestResult.from_dict(t) for t in doc.get("tests", [])]
        meta = doc.get("meta", {})
        rebuilt = build_coverage(load_catalogs(), results, meta, all_protocols=True,
                                 report_dir=meta.get("report_dir"))
        doc = certify(rebuilt, doc.get("identity"), strict=bool(meta.get("strict")),
                      exit_code=meta.get("exit_code"), report_dir=str(Path(args.source).parent))
    out = write_html(doc, args.out, Path(args.source).parent)
    print(f"kvconform: coverage.html: {out}")
    return 0


