"""kvsp-provisional-1's JCS is RFC 8785: the RFC's own samples byte for byte, Compatibility IDs that differ
exactly when the canonical forms differ, and refusals (NaN, Infinity, non-JSON types) that name the field."""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from kvconform.kvcs.vectors import _RFC8785_INPUT, _RFC8785_OUTPUT
from kvconform.kvsp import PROVISIONAL, KvspError, jcs_canonical

# RFC 8785 Appendix B: IEEE 754 binary64 values (as hex) and their canonical text.
APPENDIX_B = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),  # minus zero
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]
APPENDIX_B_ERRORS = ["7fffffffffffffff", "7ff0000000000000"]  # NaN, Infinity


def _double(bits: str) -> float:
    value: float = struct.unpack(">d", bytes.fromhex(bits))[0]
    return value


@pytest.mark.parametrize(("bits", "text"), APPENDIX_B, ids=[b for b, _ in APPENDIX_B])
def test_appendix_b_numbers_byte_for_byte(bits: str, text: str) -> None:
    assert jcs_canonical(_double(bits)) == text.encode()
    assert jcs_canonical([_double(bits)]) == f"[{text}]".encode()


@pytest.mark.parametrize("bits", APPENDIX_B_ERRORS)
def test_appendix_b_nan_and_infinity_are_refused(bits: str) -> None:
    with pytest.raises(KvspError, match=r"compat\.x: .*not a JSON number"):
        jcs_canonical({"x": _double(bits)}, name="compat")


# JSON text as a peer writes it -> the canonical text RFC 8785 gives (its section 3.2.2 sample numbers among them).
NUMBER_TEXTS = [
    ("1e+21", "1e+21"), ("1E21", "1e+21"), ("1000000000000000000000", "1e+21"), ("1e20", "100000000000000000000"),
    ("0.000001", "0.000001"), ("1e-7", "1e-7"), ("0.0000001", "1e-7"), ("1.5e-06", "0.0000015"),
    ("2e-06", "0.000002"), ("333333333.33333329", "333333333.3333333"), ("-0", "0"), ("-0.0", "0"),
    ("4.50", "4.5"), ("2e-3", "0.002"), ("1E30", "1e+30"), ("0.000000000000000000000000001", "1e-27"),
    ("16.0", "16"), ("9007199254740993.0", "9007199254740992"), ("1152921504606846976", "1152921504606847000"),
    ("123456789012.5", "123456789012.5"), ("-1.5e-300", "-1.5e-300"),
]


@pytest.mark.parametrize(("text", "canonical"), NUMBER_TEXTS, ids=[t for t, _ in NUMBER_TEXTS])
def test_numbers_as_written_by_a_peer(text: str, canonical: str) -> None:
    assert jcs_canonical(json.loads(text)) == canonical.encode()


def test_the_sample_data_of_section_3_2_2() -> None:
    assert jcs_canonical(json.loads(_RFC8785_INPUT)) == _RFC8785_OUTPUT.encode()


COMPAT = {"model": "kvconform-test", "layers": 32, "kv_heads": 8, "head_dim": 128, "block_tokens": 16,
          "dtype": "f16"}
# (x in one descriptor, x in another, whether RFC 8785 gives the two the same canonical form)
PAIRS: list[tuple[Any, Any, bool]] = [
    (1.5e-06, 2e-06, False),  # the hand-written JCS wrote both as 0.000002
    (1.5e-06, 0.0000015, True),
    (1e21, json.loads("1e+21"), True),
    (1e21, 10**21, True),  # JSON numbers are doubles: the integer 10^21 is the double 1e21
    (1e21, 1e20, False),
    (-0.0, 0.0, True),
    (-0.0, 0, True),
    (16, 16.0, True),
    (2**53, float(2**53), True),
    (2**60, float(2**60), True),
    (2**53 - 1, 2**53, False),
    (0.1 + 0.2, 0.3, False),
    (333333333.33333329, 333333333.3333333, True),
    ("1e21", 1e21, False),
    (None, False, False),
]


@pytest.mark.parametrize(("a", "b", "same"), PAIRS, ids=[f"{a!r}-{b!r}" for a, b, _ in PAIRS])
def test_compatibility_ids_differ_exactly_when_the_canonical_forms_do(a: Any, b: Any, same: bool) -> None:
    id_a = PROVISIONAL.compatibility_id({**COMPAT, "x": a})
    id_b = PROVISIONAL.compatibility_id({**COMPAT, "x": b})
    assert (id_a == id_b) is same
    assert (jcs_canonical(a) == jcs_canonical(b)) is same


@pytest.mark.parametrize("n", [2**53 + 1, -(2**53) - 1, 2**64 + 1, 10**400, -(10**400)])
def test_integers_no_double_holds_are_refused_not_rounded(n: int) -> None:
    """2^53 + 1 would round to 2^53 and share its Compatibility ID; RFC 8785 Appendix D: send such numbers as
    strings."""
    with pytest.raises(KvspError, match=r"compat\.x: .*IEEE 754"):
        PROVISIONAL.compatibility_id({**COMPAT, "x": n})


@pytest.mark.parametrize(("value", "where"), [
    ({"a": [1, float("nan")]}, r"value\.a\[1\]"), ({"a": float("inf")}, r"value\.a"),
    ([float("-inf")], r"value\[0\]"), ({"b": b"bytes"}, r"value\.b: .*bytes"), ({"s": {1, 2}}, r"value\.s"),
    ({1: "x"}, r"value: .*member name 1"), ({"k": "\ud800"}, r"value\.k: .*surrogate"),
    ({"\udfff": 1}, r"value: .*surrogate"), (object(), r"value: .*object"),
])
def test_refusals_name_the_field(value: Any, where: str) -> None:
    with pytest.raises(KvspError, match=where):
        jcs_canonical(value)


def test_deep_nesting_is_refused_without_recursion_error() -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(KvspError, match="nested"):
        jcs_canonical(deep)


def test_compat_errors_are_kvsp_errors_naming_the_member() -> None:
    with pytest.raises(KvspError, match=r"compat\.rope_theta"):
        PROVISIONAL.compatibility_id({**COMPAT, "rope_theta": math.nan})


def _as_doubles(text: bytes) -> Any:
    """JSON text read back with every number a double, as RFC 8785 reads numbers (2^60 is written
    1152921504606847000, which an exact integer parse would take for another number)."""
    return json.loads(text, parse_int=float)


_FINITE = st.floats(allow_nan=False, allow_infinity=False)
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | _FINITE | st.text(),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                     max_leaves=20)


@settings(max_examples=500, deadline=None)
@given(_FINITE)
def test_a_float_parses_back_from_its_canonical_form(value: float) -> None:
    text = jcs_canonical(value)
    assert _as_doubles(text) == value
    assert text == rfc8785.dumps(value)


@settings(max_examples=500, deadline=None)
@given(_FINITE, _FINITE)
def test_distinct_floats_have_distinct_canonical_forms(a: float, b: float) -> None:
    if a != b:  # -0.0 == 0.0: one number to RFC 8785
        assert jcs_canonical(a) != jcs_canonical(b)
    else:
        assert jcs_canonical(a) == jcs_canonical(b)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_json_values_round_trip_and_ignore_member_order(value: Any) -> None:
    text = jcs_canonical(value)
    assert _as_doubles(text) == value
    assert text == rfc8785.dumps(value)
    if isinstance(value, dict):
        assert jcs_canonical(dict(reversed(list(value.items())))) == text
