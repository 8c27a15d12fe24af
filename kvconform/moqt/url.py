"""`moqt://host[:port]/path[?query]` URLs (MOQT d22 profile §1: native QUIC, default port 443).

On native QUIC the URL's authority and path travel in the client's SETUP options AUTHORITY (0x05)
and PATH (0x01) (profile §5); `MoqtUrl.authority` and `MoqtUrl.path_option` give those values.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

SCHEME = "moqt"
DEFAULT_PORT = 443


@dataclass(frozen=True)
class MoqtUrl:
    """A parsed `moqt://` URL (profile §1 "URI")."""

    host: str
    port: int
    path: str = ""
    query: str = ""

    @property
    def authority(self) -> str:
        """`host:port` as sent in the AUTHORITY setup option (IPv6 literals bracketed)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def path_option(self) -> str:
        """`path-abempty` plus `?query`, the PATH setup option's value (empty when the URL has none)."""
        return self.path + (f"?{self.query}" if self.query else "")

    def __str__(self) -> str:
        return f"{SCHEME}://{self.authority}{self.path_option}"


def parse_url(url: str) -> MoqtUrl:
    """Parse `moqt://host[:port]/path[?query]`; raises ValueError naming the part that is wrong."""
    parts = urlsplit(url)
    if parts.scheme != SCHEME:
        raise ValueError(f"MOQT URL {url!r}: scheme is {parts.scheme!r}, expected {SCHEME!r}")
    if not parts.hostname:
        raise ValueError(f"MOQT URL {url!r}: host is missing")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"MOQT URL {url!r}: userinfo is not allowed in the authority")
    if parts.fragment:
        raise ValueError(f"MOQT URL {url!r}: fragment is not allowed")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"MOQT URL {url!r}: port is not a number in 0..65535") from exc
    return MoqtUrl(
        host=parts.hostname,
        port=DEFAULT_PORT if port is None else port,
        path=parts.path,
        query=parts.query,
    )
