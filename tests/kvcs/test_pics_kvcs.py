"""The KVCS PICS schema (testbeds/schema/pics-kvcs.schema.json) is the one testbeds are checked with."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvconform.targets.testbed import TestbedError, load_testbed, schema_dir


def _bed(tmp_path: Path, pics: str) -> Path:
    path = tmp_path / "bed.yaml"
    path.write_text(f"name: t\ntargets:\n  r: {{driver: reference, pics: {{kvcs: {pics}}}}}\n")
    return path


def test_schema_file_is_packaged() -> None:
    assert (schema_dir() / "pics-kvcs.schema.json").is_file()


def test_role_objects_and_profile_are_accepted(tmp_path: Path) -> None:
    bed = load_testbed(str(_bed(tmp_path, "{kvsp_profile: kvsp-provisional-1, publisher: {kv_track: true}, "
                                          "relay: {}, consumer: {budget_s: 5}}")))
    assert bed.targets["r"]["pics"]["kvcs"]["publisher"] == {"kv_track": True}


@pytest.mark.parametrize(("pics", "where"), [
    ("{publisher: 3}", "kvcs.publisher"),
    ("{relay: [1]}", "kvcs.relay"),
    ("{consumer: yes}", "kvcs.consumer"),
    ("{kvsp_profile: ''}", "kvcs.kvsp_profile"),
])
def test_malformed_pics_are_rejected_naming_the_path(tmp_path: Path, pics: str, where: str) -> None:
    with pytest.raises(TestbedError, match=where.replace(".", r"\.")):
        load_testbed(str(_bed(tmp_path, pics)))
