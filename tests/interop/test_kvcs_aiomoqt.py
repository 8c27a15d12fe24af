"""KVCS across aiomoqt's relay: the reference publisher -> aiomoqt's relay -> the reference consumer, and the
kvcs-relay conformance suite against aiomoqt's relay.

The cache is 10 layers of 4 blocks with the issue's Object size (B=16, Hkv=8, D=128: 32 KiB k and v
Objects; 10 layers so that the publisher also sends a manifest version after layer 8). It stays small on
purpose: aiomoqt's relay bounds what it buffers (an upstream FETCH must finish within 10 s, and a
PUBLISH_DONE whose streams have not all arrived is released after 3 s: docs/interop-aiomoqt.md #14,
#15), which the full 128 MiB cache of bench/bench_kvcs.py exceeds on this machine.

    kvconform run kvcs-relay --testbed testbeds/aiomoqt.yaml --target moqt://127.0.0.1:<port>

runs with the testbed's PICS ``kvcs.relay.authorization: false`` (aiomoqt's relay has none). Every check it
fails there must be a known disagreement (``disagreements.KVCS_RELAY_SUITE_FAILS_ON_AIOMOQT``) and every
known one must still fail (the version is pinned: a change means the entry is to be revisited).
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict
from pathlib import Path

import pytest

from kvconform import evidence

from .disagreements import KVCS_RELAY_SUITE_FAILS_ON_AIOMOQT
from .kvcs_transfer import VARIANTS, cache_spec, data_bytes, transfer
from .peers import RelayEndpoint, suite_report_dir, suite_verdicts

pytestmark = pytest.mark.interop

GEOMETRY = {"layers": 10, "blocks": 4, "block_tokens": 16, "kv_heads": 8, "head_dim": 128}
BUDGET_S = 60.0
SUITE_TIMEOUT_S = 300.0


@pytest.mark.timeout(BUDGET_S + 120)
@pytest.mark.parametrize("variant", VARIANTS)
def test_reference_cache_crosses_aiomoqt_relay_intact(aiomoqt_relay_endpoint: RelayEndpoint, variant: str) -> None:
    spec = cache_spec(GEOMETRY)
    assert spec.section_octets == 32 * 1024
    with tempfile.TemporaryDirectory(prefix="kvc-interop-") as tmp:
        result = transfer(spec, spec.write_json(Path(tmp) / "cache.json"), aiomoqt_relay_endpoint, variant, BUDGET_S)
    evidence.record("received", "kvcs-transfer", {**asdict(result), "cache_data_bytes": data_bytes(spec)})
    assert result.error is None and result.intact, \
        f"{variant}: the cache did not cross aiomoqt's relay intact: {result.error}"
    assert result.bad_layers == [] and result.rejected == 0
    assert result.consumer_mode == ("live" if variant == "live" else "fetch")
    if variant == "live":
        assert result.held, "the publisher started publishing before the relay had subscribed to its data tracks"


@pytest.mark.timeout(SUITE_TIMEOUT_S + 60)
def test_kvcs_relay_suite_against_aiomoqt_relay(aiomoqt_relay_endpoint: RelayEndpoint,
                                                request: pytest.FixtureRequest, tmp_path: Path) -> None:
    report = suite_report_dir(request.config.getoption("kvconform_report_dir", None), "kvcs-relay-on-aiomoqt", tmp_path)
    verdicts = suite_verdicts("kvcs-relay", aiomoqt_relay_endpoint.url, report, SUITE_TIMEOUT_S)
    evidence.record("note", "suite-verdicts", {name: t["verdict"] for name, t in sorted(verdicts.items())})
    failed = {name: t.get("message", "") for name, t in verdicts.items() if t["verdict"] == "fail"}
    unexpected = {name: msg for name, msg in failed.items() if name not in KVCS_RELAY_SUITE_FAILS_ON_AIOMOQT}
    assert not unexpected, ("kvcs-relay checks failing on aiomoqt's relay that are not known disagreements "
                            f"(triage them into disagreements.KVCS_RELAY_SUITE_FAILS_ON_AIOMOQT or fix the suite); "
                            f"report {report}:\n" + "\n".join(f"  {n}: {m}" for n, m in sorted(unexpected.items())))
    no_longer = {name: verdicts[name]["verdict"] if name in verdicts else "not run"
                 for name in KVCS_RELAY_SUITE_FAILS_ON_AIOMOQT if name not in failed}
    assert not no_longer, (f"known aiomoqt disagreements that did not fail this time: {no_longer}; revisit "
                           f"disagreements.KVCS_RELAY_SUITE_FAILS_ON_AIOMOQT (report {report})")
    passed = sorted(name for name, t in verdicts.items() if t["verdict"] == "pass")
    assert passed, "no kvcs-relay check passed against aiomoqt's relay"
