"""`kvconform report sign` / `verify`: the SHA-256 manifest of a report folder and its signature catch an edited,
an added and a removed file, and a signature by another key (Ed25519 and ECDSA P-256)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from kvconform import cli
from kvconform.reports.manifest import MANIFEST, SIGNATURE, ManifestError, write_manifest
from kvconform.reports.signature import sign, verify


@pytest.fixture
def report(tmp_path: Path) -> Path:
    """A report folder as a run leaves it: files at the top and in sub-folders, then the manifest."""
    root = tmp_path / "rep"
    (root / "evidence").mkdir(parents=True)
    (root / "allure-results").mkdir()
    (root / "coverage.json").write_text('{"format": "kvconform-coverage/1"}\n')
    (root / "coverage.html").write_text("<html>PASSED</html>\n")
    (root / "evidence" / "a.json").write_text('{"verdict": "pass"}\n')
    (root / "evidence" / "a.bin").write_bytes(bytes(range(256)))
    (root / "allure-results" / "x-result.json").write_text("{}\n")
    write_manifest(root)
    return root


def _keys(tmp_path: Path, name: str, algorithm: str) -> tuple[Path, Path]:
    key = tmp_path / f"{name}.pem"
    assert cli.main(["report", "keygen", "--key", str(key), "--algorithm", algorithm]) == 0
    return key, tmp_path / f"{name}.pem.pub.pem"


def _verify(report: Path, capsys: pytest.CaptureFixture[str], *pub: str) -> tuple[int, str]:
    code = cli.main(["report", "verify", "--report-dir", str(report), *pub])
    return code, capsys.readouterr().out


def test_manifest_lists_every_file_sorted_in_sha256sum_format(report: Path) -> None:
    lines = (report / MANIFEST).read_text().splitlines()
    assert [line.split("  ", 1)[1] for line in lines] == ["allure-results/x-result.json", "coverage.html",
                                                          "coverage.json", "evidence/a.bin", "evidence/a.json"]
    if shutil.which("sha256sum"):  # the format is sha256sum's, so the coreutils check it as well
        proc = subprocess.run(["sha256sum", "--check", "--quiet", MANIFEST], cwd=report, capture_output=True,
                              timeout=30)
        assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("algorithm", ["ed25519", "p256"])
def test_sign_and_verify_catch_every_change(report: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            algorithm: str) -> None:
    key, pub = _keys(tmp_path, "vendor", algorithm)
    capsys.readouterr()
    assert cli.main(["report", "sign", "--report-dir", str(report), "--key", str(key)]) == 0
    sig = json.loads((report / SIGNATURE).read_text())
    assert sig["algorithm"] == {"ed25519": "ed25519", "p256": "ecdsa-p256-sha256"}[algorithm]
    code, out = _verify(report, capsys, "--pub", str(pub))
    assert code == 0 and "signature: valid" in out and "matches its manifest" in out, out

    # An edited file.
    page = report / "coverage.html"
    original = page.read_text()
    page.write_text(original.replace("PASSED", "FAILED"))
    code, out = _verify(report, capsys, "--pub", str(pub))
    assert code == 1 and "edited: coverage.html" in out, out
    page.write_text(original)
    # An added file, in a sub-folder.
    extra = report / "evidence" / "planted.json"
    extra.write_text("{}")
    code, out = _verify(report, capsys, "--pub", str(pub))
    assert code == 1 and "added: evidence/planted.json" in out, out
    extra.unlink()
    # A removed file.
    kept = (report / "evidence" / "a.bin").read_bytes()
    (report / "evidence" / "a.bin").unlink()
    code, out = _verify(report, capsys, "--pub", str(pub))
    assert code == 1 and "removed: evidence/a.bin" in out, out
    (report / "evidence" / "a.bin").write_bytes(kept)
    assert _verify(report, capsys, "--pub", str(pub))[0] == 0, "restored, it verifies again"

    # A signature by another key than the one the certification body expects.
    _, other_pub = _keys(tmp_path, "someone-else", algorithm)
    capsys.readouterr()
    code, out = _verify(report, capsys, "--pub", str(other_pub))
    assert code == 1 and "signature: invalid" in out and "--pub" in out, out


def test_an_edited_manifest_breaks_the_signature(report: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Whoever edits a file and writes a fresh manifest to match cannot make the signature follow."""
    key, pub = _keys(tmp_path, "vendor", "ed25519")
    sign(report, key)
    (report / "coverage.html").write_text("<html>edited</html>\n")
    saved = (report / SIGNATURE).read_text()
    write_manifest(report)  # removes the signature: put it back as an attacker would
    (report / SIGNATURE).write_text(saved)
    code, out = _verify(report, capsys, "--pub", str(pub))
    assert code == 1 and "signature: invalid" in out, out
    # Without --pub the signature is checked against the key it carries: still invalid.
    code, out = _verify(report, capsys)
    assert code == 1 and "signature: invalid" in out, out


def test_sign_refuses_a_folder_that_no_longer_matches(report: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    key, _ = _keys(tmp_path, "vendor", "ed25519")
    (report / "coverage.json").write_text("{}")
    capsys.readouterr()
    assert cli.main(["report", "sign", "--report-dir", str(report), "--key", str(key)]) == 1
    err = capsys.readouterr().err
    assert "does not match" in err and "edited: coverage.json" in err, err
    assert not (report / SIGNATURE).exists()


def test_verify_without_signature_and_bad_inputs(report: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _verify(report, capsys)
    assert code == 0 and "signature: absent" in out, "an unsigned folder that matches its manifest verifies"
    _, pub = _keys(tmp_path, "vendor", "ed25519")
    capsys.readouterr()
    code, out = _verify(report, capsys, "--pub", str(pub))
    assert code == 1 and "missing, but --pub asks for a signature" in out, out
    (tmp_path / "rsa.pem").write_text("-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    with pytest.raises(ManifestError, match="--key"):
        sign(report, tmp_path / "rsa.pem")
    (report / MANIFEST).unlink()
    with pytest.raises(ManifestError, match="cannot read the manifest"):
        verify(report)
