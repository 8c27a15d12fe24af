"""Block geometry (B, L, Hkv, D) and the sizes the TLKV text derives from it."""

from __future__ import annotations

from dataclasses import dataclass

HEADER_SIZE = 28
RECORD_HEADER_SIZE = 12
CRC_SIZE = 4
MIN_ENVELOPE_SIZE = HEADER_SIZE + CRC_SIZE


@dataclass(frozen=True)
class Geometry:
    """The four dimensions every TLKV envelope header carries (TLKV "Export envelope")."""

    block_tokens: int
    n_layers: int
    n_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        for name in ("block_tokens", "n_layers", "n_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 1 <= value <= 0xFFFFFFFF:
                raise ValueError(f"geometry.{name}: got {value!r}, expected an integer in 1..2^32-1")

    @property
    def kv_shape(self) -> tuple[int, int, int, int, int]:
        """Shape of one block's values: [L][2][Hkv][B][D] (axis 1: 0 = K, 1 = V)."""
        return (self.n_layers, 2, self.n_kv_heads, self.block_tokens, self.head_dim)

    @property
    def slabs(self) -> int:
        """Number of (layer, K or V, head) slabs: the count of v2 scales."""
        return self.n_layers * 2 * self.n_kv_heads

    @property
    def elements(self) -> int:
        return self.slabs * self.block_tokens * self.head_dim

    def payload_size(self, version: int) -> int:
        """P: v1 = L*2*Hkv*B*D*2, v2 = L*2*Hkv*(B*D+4)."""
        if version == 1:
            return self.elements * 2
        if version == 2:
            return self.slabs * (self.block_tokens * self.head_dim + 4)
        raise ValueError(f"version: got {version}, expected 1 or 2")

    def envelope_size(self, n_blocks: int, version: int) -> int:
        """28 + n * (12 + P) + 4 (tl_kv_export_bytes)."""
        return HEADER_SIZE + n_blocks * (RECORD_HEADER_SIZE + self.payload_size(version)) + CRC_SIZE

    def as_dict(self) -> dict[str, int]:
        return {
            "block_tokens": self.block_tokens,
            "n_layers": self.n_layers,
            "n_kv_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
        }

    @classmethod
    def from_dict(cls, d: dict[str, int]) -> Geometry:
        return cls(int(d["block_tokens"]), int(d["n_layers"]), int(d["n_kv_heads"]), int(d["head_dim"]))

    @classmethod
    def parse(cls, text: str) -> Geometry:
        """Parse "B,L,Hkv,D" (the order of `kvconform serve tlkv-decode --pool`)."""
        parts = text.split(",")
        if len(parts) != 4:
            raise ValueError(f"geometry: got {text!r}, expected four integers B,L,Hkv,D")
        b, layers, hkv, d = (int(p) for p in parts)
        return cls(b, layers, hkv, d)

    def __str__(self) -> str:
        return f"{self.block_tokens},{self.n_layers},{self.n_kv_heads},{self.head_dim}"
