"""A correct publisher the fetch-limit check must not fail (target python:tests.kvcs.serial_fetch_publisher:
SerialFetchPublisher): it serves one FETCH of its session at a time and queues the others, answering each once
the previous one's data and FIN have been sent. It refuses nothing, so with a declared limit of 2 it is never
over it, and every fetch is served in the end."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from kvconform.kvcs.publisher import KvcsPublisher
from kvconform.moqt.client import MoqtClient
from kvconform.moqt.messages import Fetch
from kvconform.moqt.session import RequestReceived

SLOT_TIMEOUT = 60.0


class SerialFetchPublisher(KvcsPublisher):
    """The reference publisher with FETCHes served strictly one after another (a queue, never a refusal)."""

    def __init__(self, spec: Any, **options: Any) -> None:
        options.pop("fetch_limit", None)  # its own discipline instead of the reference's limiter (1 <= any limit)
        super().__init__(spec, **options)
        self.busy = False
        self.queue: collections.deque[RequestReceived] = collections.deque()

    async def publish(self, client: MoqtClient, token: bytes | None, **kwargs: Any) -> None:
        client.on_request = self._one_at_a_time
        await super().publish(client, token, **kwargs)

    def _one_at_a_time(self, client: MoqtClient, event: RequestReceived) -> bool:
        if not isinstance(event.message, Fetch):
            return False
        self.queue.append(event)
        if not self.busy:
            self._next(client)
        return True

    def _next(self, client: MoqtClient) -> None:
        if not self.queue:
            self.busy = False
            return
        self.busy = True
        event = self.queue.popleft()
        client._serve(event)  # the client's own FETCH service (FETCH_OK, one fetch stream)
        streams = client.session.data_streams_of(event.stream_id)
        asyncio.get_running_loop().call_soon(
            client.connection.when_sent, streams, lambda: self._next(client), SLOT_TIMEOUT)
