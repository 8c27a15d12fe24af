"""KVCS-OPS-STREAMS machinery: the needed stream count, the declared pipeline depth, and the aioquic
adapter's uni-stream grant (``quic.granting_streams_uni``) as the peer reads it
(``MoqtConnection.peer_transport_parameters``) over 127.0.0.1."""

from __future__ import annotations

import asyncio

import pytest

from kvconform.conformance.kvcs.streams import check_grant, grant_problem, needed_streams_uni, pipeline_layers
from kvconform.moqt import quic
from kvconform.targets.spec import Pics
from kvconform.verdicts import HarnessBug

TIMEOUT = 5.0
AIOQUIC_DEFAULT_UNI = 128  # aioquic's own initial_max_streams_uni


def test_needed_streams_are_k_and_v_per_layer_plus_manifest_and_fill() -> None:
    assert [needed_streams_uni(n) for n in (1, 4, 20)] == [4, 10, 42]


def test_pipeline_layers_comes_from_the_pics_or_the_suites_publication() -> None:
    assert pipeline_layers(Pics({}), "relay", 5)[0] == 5
    assert pipeline_layers(Pics({"kvcs": {"relay": {"pipeline_layers": 64}}}), "relay", 5)[0] == 64
    for bad in (0, -3, "8", True, 2.5):  # the PICS schema refuses these first: reaching here is kvconform's bug
        with pytest.raises(HarnessBug, match=r"kvcs\.relay\.pipeline_layers: got"):
            pipeline_layers(Pics({"kvcs": {"relay": {"pipeline_layers": bad}}}), "relay", 5)


def test_a_grant_below_the_need_fails_naming_parameter_values_and_requirement() -> None:
    pics = Pics({"kvcs": {"consumer": {"pipeline_layers": 8}}})
    assert grant_problem(18, who="c", peer="r", pics=pics, role="consumer", default_layers=4) is None
    problem = grant_problem(17, who="c", peer="r", pics=pics, role="consumer", default_layers=4)
    assert problem is not None
    assert "initial_max_streams_uni = 17" in problem and ">= 18" in problem and "KVCS-OPS-STREAMS" in problem
    with pytest.raises(AssertionError, match="initial_max_streams_uni = 3"):
        check_grant(3, who="c", peer="r", pics=pics, role="consumer", default_layers=4)


def _grants(server_grant: int | None, client_grant: int | None) -> tuple[int | None, int | None]:
    """(what the client read of the server's grant, what the server read of the client's grant)."""

    async def scenario() -> tuple[int | None, int | None]:
        seen: asyncio.Queue[quic.MoqtConnection] = asyncio.Queue()

        async def handler(connection: quic.MoqtConnection) -> None:
            seen.put_nowait(connection)
            await connection.wait_closed(timeout=30.0)

        async def serve() -> quic.MoqtServer:
            return await quic.serve("127.0.0.1", 0, handler)

        async def connect(url: str) -> quic.MoqtConnection:
            return await quic.connect(url, timeout=TIMEOUT)

        if server_grant is None:
            server = await serve()
        else:
            with quic.granting_streams_uni(server_grant):
                server = await serve()
        try:
            if client_grant is None:
                client = await connect(server.url)
            else:
                with quic.granting_streams_uni(client_grant):
                    client = await connect(server.url)
            accepted = await asyncio.wait_for(seen.get(), TIMEOUT)
            to_client, to_server = client.peer_transport_parameters, accepted.peer_transport_parameters
            await client.close(timeout=1.0)
        finally:
            await server.close(TIMEOUT)
        assert to_client is not None and to_server is not None
        return to_client.initial_max_streams_uni, to_server.initial_max_streams_uni

    return asyncio.run(asyncio.wait_for(scenario(), 4 * TIMEOUT))


def test_each_side_reads_the_uni_stream_grant_the_other_sent() -> None:
    assert _grants(None, None) == (AIOQUIC_DEFAULT_UNI, AIOQUIC_DEFAULT_UNI)
    assert _grants(6, None) == (6, AIOQUIC_DEFAULT_UNI)
    assert _grants(None, 3) == (AIOQUIC_DEFAULT_UNI, 3)


def test_the_grant_applies_only_inside_the_block() -> None:
    with quic.granting_streams_uni(2):
        pass
    assert _grants(None, None) == (AIOQUIC_DEFAULT_UNI, AIOQUIC_DEFAULT_UNI)
