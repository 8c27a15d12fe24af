"""The endpoint of a KBTP target in another process (over a userspace wire binding or a verbs device): the harness
dials it for each initiator.

A remote target keeps its state between checks. Each check ends by releasing the sessions it opened (GOODBYE
with RELEASE from every Initiator ID it used, on a fresh connection), so the next check meets the pool its
PICS declare; a target that refuses is left as it is and the next check's verdicts say so.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any, Protocol

from kvconform import evidence
from kvconform.kbtp.constants import Features, Status
from kvconform.rdma import ConnState, Node, sleep, wait_until
from kvconform.targets.kbtp import TargetParams
from kvconform.targets.kbtp_client import Ended, HarnessInitiator
from kvconform.verdicts import current_check

__all__ = ["RELEASE_BUDGET_S", "Released", "RemoteDriver", "RemoteTarget"]

# A target may still count the old connection live for a while after it closed (longer across a VM's NAT): the
# release retries for this long, backing off from 10 ms to 250 ms
RELEASE_BUDGET_S = 5.0
RELEASE_WAIT_S = 2.0


@dataclass(frozen=True)
class Released:
    """A session the harness ended with GOODBYE RELEASE after a check, and the handle range it held: after it
    the target holds no binding in that range (KBTP-GOODBYE-RELEASE) until a later session binds one."""

    initiator_id: bytes
    handle_base: int
    handle_count: int
    check: str

    def holds(self, handle: int) -> bool:
        return self.handle_base <= handle < self.handle_base + self.handle_count


class RemoteDriver(Protocol):
    """Where a remote target listens, the fabric that reaches it, and the sessions released on it so far."""

    host: str
    port: int
    released: list[Released]

    def make_fabric(self, params: TargetParams, *, trace: bool = False) -> Any: ...


class RemoteTarget:
    """The endpoint of a remote target: the harness dials it for each initiator."""

    def __init__(self, driver: RemoteDriver, fabric: Any) -> None:
        self.driver = driver
        self.fabric = fabric

    def attach(self, conn: Any) -> None:
        raise TypeError("a remote target is dialled (RemoteTarget.dial), not attached")

    def dial(self, node: Node, name: str, fabric: Any = None) -> Any:
        fabric = fabric or self.fabric
        return fabric.dial(fabric.remote("target", self.driver.host, self.driver.port), node, name=name)

    def release_sessions(self, bed: Any) -> None:
        """GOODBYE with RELEASE for every Initiator ID ``bed`` used, each on a fresh connection (bounded)."""

        ids = list(dict.fromkeys(bytes(ini.initiator_id) for ini in bed.initiators))
        bed.fabric.close()  # the check's own connections end first: the target starts retaining their sessions
        if not ids:
            return
        fab = self.driver.make_fabric(bed.params)
        try:
            for n, iid in enumerate(ids):
                give_up = time.monotonic() + RELEASE_BUDGET_S
                pause = 0.01
                released = False
                for attempt in itertools.count():
                    if time.monotonic() > give_up:
                        break
                    name = f"release{n}.{attempt}"
                    try:
                        conn = self.dial(fab.node(name), f"{name}-conn", fab)
                    except OSError as exc:
                        if isinstance(exc, ConnectionRefusedError) or "refused" in str(exc).lower():
                            return  # the target is gone: the next check finds out and says so
                        continue  # a local failure (a port still in TIME_WAIT): a new connection may go through
                    ini = HarnessInitiator(fab, conn.node, conn, name, quiet=True)
                    ini.initiator_id = iid

                    def release(ini: Any = ini, conn: Any = conn, pause: float = pause) -> Any:
                        ack = yield from ini.hello(Features(0), allow_end=True)
                        if isinstance(ack, Ended) or ack.status != Status.OK:
                            yield from sleep(pause)
                            return False
                        ini.goodbye(release=True)
                        closed = yield from wait_until(lambda: conn.state is not ConnState.CONNECTED,
                                                       name="released", timeout=RELEASE_WAIT_S)
                        if closed:  # the target ended the session: from now on the range holds no binding
                            context = current_check()
                            self.driver.released.append(Released(ini.initiator_id, ack.handle_base,
                                                                 ack.handle_count,
                                                                 context.nodeid if context else bed.label))
                        return True

                    handle = fab.spawn(name, release())
                    try:
                        fab.run()
                    except Exception as exc:  # best effort: the next check's verdicts show what was left
                        evidence.note(f"releasing Initiator ID {iid.hex()} after the check failed: {exc!r}")
                        break
                    if handle.result:
                        released = True
                        break
                    pause = min(pause * 2, 0.25)
                if not released:  # the next checks may find the target short of a session: say why
                    evidence.note(f"the target did not release Initiator ID {iid.hex()} within {RELEASE_BUDGET_S} s "
                                  "after the check (HELLO with it refused): the next checks may find a session fewer")
        finally:
            fab.close()
