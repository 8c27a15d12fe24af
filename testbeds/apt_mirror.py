"""The Debian mirror this machine's apt uses, for the roots the testbeds debootstrap (the docker base image, the RDMA
VM): taken from the machine's own apt configuration, so the project names no mirror.

    python -m kvconform.testbeds.apt_mirror        # prints the URI; $DEBIAN_MIRROR overrides

Reads the one-line ``sources.list`` files and the deb822 ``*.sources`` files; takes the first ``deb`` source of the
Debian archive itself (not its security or updates suites, which live apart on some mirrors), preferring a URI
whose path ends in ``/debian``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["MirrorNotFound", "debian_mirror"]

APT_ETC = Path("/etc/apt")


class MirrorNotFound(Exception):
    """No ``deb`` source of the Debian archive in the apt configuration, and no $DEBIAN_MIRROR."""


def _is_archive(suites: list[str]) -> bool:
    return any(s and "-" not in s and "/" not in s for s in suites)


def _deb822(text: str) -> list[str]:
    uris: list[str] = []
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line[:1] not in ("#", " ", "\t") and ":" in line:
                key, value = line.split(":", 1)
                fields[key.strip().lower()] = value.strip()
        if ("deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no"
                and _is_archive(fields.get("suites", "").split())):
            uris += fields.get("uris", "").split()
    return uris


def _one_line(text: str) -> list[str]:
    uris: list[str] = []
    for line in text.splitlines():
        words = [w for w in line.split("#", 1)[0].split() if not (w.startswith("[") or w.endswith("]"))]
        if len(words) >= 3 and words[0] == "deb" and _is_archive(words[2:3]):
            uris.append(words[1])
    return uris


def debian_mirror(etc: Path = APT_ETC) -> str:
    """$DEBIAN_MIRROR, else the first Debian archive URI of ``etc``'s sources."""
    if os.environ.get("DEBIAN_MIRROR"):
        return os.environ["DEBIAN_MIRROR"]
    uris: list[str] = []
    one_line = [etc / "sources.list", *sorted((etc / "sources.list.d").glob("*.list"))]
    for path in one_line:
        if path.is_file():
            uris += _one_line(path.read_text("utf-8", "replace"))
    for path in sorted((etc / "sources.list.d").glob("*.sources")):
        uris += _deb822(path.read_text("utf-8", "replace"))
    if not uris:
        raise MirrorNotFound(f"no 'deb' source of the Debian archive under {etc} (sources.list, sources.list.d/); "
                             f"set DEBIAN_MIRROR")
    # A third-party repository (a vendor's "nodistro" suite) can look like the archive: prefer a .../debian path.
    uris = [u.rstrip("/") for u in uris]
    return next((u for u in uris if u.rsplit("/", 1)[-1] == "debian"), uris[0])


if __name__ == "__main__":
    try:
        print(debian_mirror())
    except MirrorNotFound as exc:
        print(f"apt_mirror: {exc}", file=sys.stderr)
        sys.exit(2)
