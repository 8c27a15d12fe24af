"""The testbeds take the Debian mirror from the machine's apt configuration (the project names none)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvconform.testbeds.apt_mirror import MirrorNotFound, debian_mirror


def _etc(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "sources.list.d").mkdir()
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_the_archive_of_a_deb822_source_not_its_security_suite(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEBIAN_MIRROR", raising=False)
    etc = _etc(tmp_path, {"sources.list.d/debian.sources":
                          "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\n"
                          "Types: deb\n# a comment\nURIs: http://mirror.example/debian/\nSuites: bookworm "
                          "bookworm-updates\nComponents: main\n"})
    assert debian_mirror(etc) == "http://mirror.example/debian"


def test_a_one_line_source_and_a_vendor_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEBIAN_MIRROR", raising=False)
    etc = _etc(tmp_path, {"sources.list": "deb [arch=amd64] http://vendor.example/node nodistro main\n"
                                          "# deb http://old.example/debian bookworm main\n"
                                          "deb http://local.example/debian bookworm main contrib\n"})
    assert debian_mirror(etc) == "http://local.example/debian"


def test_the_environment_wins_and_nothing_found_names_the_way_out(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEBIAN_MIRROR", "http://env.example/debian")
    assert debian_mirror(_etc(tmp_path, {})) == "http://env.example/debian"
    monkeypatch.delenv("DEBIAN_MIRROR")
    with pytest.raises(MirrorNotFound, match="DEBIAN_MIRROR"):
        debian_mirror(tmp_path)
