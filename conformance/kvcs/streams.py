"""KVCS-OPS-STREAMS, shared by the three KVCS suites: does an endpoint grant enough concurrent unidirectional
streams for the layers it pipelines?

KVCS "Operational Considerations": "Endpoints SHOULD grant enough concurrent unidirectional streams for the
number of layers they pipeline." Each layer is one Group, and each Group of a data track is one Subgroup
stream (KVCS-GROUP-SUBGROUP-ZERO), so pipelining ``n`` layers of k and v keeps ``2 n`` data streams open at
once, plus the manifest's stream and a fill stream. What is observable is the QUIC transport parameter
initial_max_streams_uni (RFC 9000 section 18.2) the endpoint under test grants the harness's session; how
many layers it pipelines is declared (PICS ``kvcs.<role>.pipeline_layers``), by default the number of
layers of the suite's own publication.
"""

from __future__ import annotations

from kvconform.targets.spec import Pics
from kvconform.verdicts import HarnessBug, check, inconclusive

__all__ = ["DATA_TRACKS_PER_LAYER", "EXTRA_STREAMS", "REQUIREMENT", "check_grant", "grant_problem",
           "needed_streams_uni", "pipeline_layers"]

REQUIREMENT = "KVCS-OPS-STREAMS"
DATA_TRACKS_PER_LAYER = 2  # k and v: one Subgroup stream each per layer (Group)
EXTRA_STREAMS = 2  # the manifest track's stream and one fill stream


def needed_streams_uni(layers: int) -> int:
    """The unidirectional streams ``layers`` pipelined layers keep open at once."""
    return DATA_TRACKS_PER_LAYER * layers + EXTRA_STREAMS


def pipeline_layers(pics: Pics, role: str, default: int) -> tuple[int, str]:
    """The layers the ``role`` under test pipelines and where that number comes from."""
    path = f"kvcs.{role}.pipeline_layers"
    value = pics.get(path)
    if value is None:
        return default, f"PICS {path} absent: the {default} layers of the suite's publication"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:  # the schema refuses it first
        raise HarnessBug(f"PICS {path}: got {value!r}, expected a positive integer (the PICS schema should refuse "
                         "it)")
    return value, f"PICS {path} = {value}"


def grant_problem(granted: int | None, *, who: str, peer: str, pics: Pics, role: str,
                  default_layers: int) -> str | None:
    """What is wrong with ``granted`` (the initial_max_streams_uni ``who`` sent ``peer``), citing
    KVCS-OPS-STREAMS; None when it is enough. Inconclusive when it was not observed (None)."""
    layers, source = pipeline_layers(pics, role, default_layers)
    needed = needed_streams_uni(layers)
    if granted is None:
        inconclusive(f"{who}'s QUIC transport parameters (initial_max_streams_uni) to {peer} were not observed "
                     f"[{REQUIREMENT}]")
    if granted >= needed:
        return None
    return (f"{who} granted {peer} initial_max_streams_uni = {granted}, needed >= {needed} = "
            f"{DATA_TRACKS_PER_LAYER} (k, v) x {layers} pipelined layers ({source}) + {EXTRA_STREAMS} (manifest, "
            f"fill) [{REQUIREMENT}]")


def check_grant(granted: int | None, *, who: str, peer: str, pics: Pics, role: str, default_layers: int) -> None:
    """Fail with ``grant_problem``'s message when the grant is too small."""
    problem = grant_problem(granted, who=who, peer=peer, pics=pics, role=role, default_layers=default_layers)
    check(problem is None, str(problem), req=REQUIREMENT)
