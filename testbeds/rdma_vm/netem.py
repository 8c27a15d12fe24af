"""``tc netem`` on the testbed VM's interfaces (issue 23 item 5, the VM half): the kernel's devices build their own
packets, so the harness's seeded impairment stage (kvconform.rdma.wire.impair) cannot reach them; the VM's own
qdiscs can.

`Netem.parse` takes the ``--impair`` grammar (``loss=0.01,reorder=1%,dup=0.01,delay=5ms``) and `Netem.args` gives
what follows ``tc qdisc add dev IF root netem``. netem draws from the kernel's random generator and has no seed:
a run under it replays the statistics of the decisions, never each packet's fate (``seed=`` is refused).

Reordering is what netem can do of it: a packet leaves before the ones queued ahead of it, so there must be a
delay to jump. With a ``delay``, ``reorder=P`` sends that share at once past the delayed rest (netem's own
meaning); without one, ``reorder=P`` holds that share back ``hold`` (2 ms, the userspace stage's default) while
the rest leave at once (``delay 2ms reorder (1-P)``): the userspace stage's meaning, and nothing else delayed.

Where it acts (measured in the VM, docs/interop-rdma.md "Under netem"): the in-VM pair's traffic never leaves
the VM: siw0's TCP streams to 10.77.0.1 (a dummy netdev's address, a local route) cross ``lo``'s qdisc both
ways; rxe0's packets to its own address are looped back inside rdma_rxe before any qdisc, so netem on ``lo``
cannot touch them. The NICs facing the host (rxe1's RoCEv2 segment, siw1's user-mode network) carry the
host<->VM runs; a root qdisc there impairs what the VM sends (the kernel device's packets), not what it receives.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from kvconform.rdma.wire.impair import NETEM_ENV, Impairment, ImpairmentError

# The environment variable testbeds/rdma-vm/netem.sh reads inside the VM: netem's arguments.
VM_ENV = "KVCONFORM_VM_NETEM"
# ... and the one a run's coverage.json records in its meta (fixtures/kbtp.py): what the link did.
META_ENV = NETEM_ENV


@dataclass(frozen=True)
class Netem:
    """One netem qdisc: probabilities in [0, 1], times in seconds."""

    loss: float = 0.0
    reorder: float = 0.0
    dup: float = 0.0
    delay: float = 0.0
    hold: float = 0.002  # without a delay: how long a reordered packet is held back

    @classmethod
    def parse(cls, spec: str) -> Netem:
        """The ``--impair`` grammar; ValueError (ImpairmentError) for what netem cannot do (seed, split, rto)."""
        imp = Impairment.parse(spec)
        given = {p.partition("=")[0].strip() for p in spec.split(",") if p.strip()}
        if "seed" in given:
            raise ImpairmentError(f"netem {spec!r}: netem has no seed (the kernel's generator decides): the VM half "
                                  "replays the statistics, not each packet's fate")
        unsupported = given & {"split", "rto"}
        if unsupported:
            raise ImpairmentError(f"netem {spec!r}: {', '.join(sorted(unsupported))} is the userspace iWARP stage's "
                                  "(kvconform.rdma.wire.impair); TCP below siw does its own segmentation and timeouts")
        if not (imp.loss or imp.reorder or imp.dup or imp.delay):
            raise ImpairmentError(f"netem {spec!r}: nothing to do")
        return cls(loss=imp.loss, reorder=imp.reorder, dup=imp.dup, delay=imp.delay, hold=imp.hold)

    def args(self) -> list[str]:
        """netem's arguments (after ``tc qdisc add dev IF root netem``)."""
        out: list[str] = []
        if self.loss:
            out += ["loss", _pct(self.loss)]
        if self.dup:
            out += ["duplicate", _pct(self.dup)]
        if self.delay:
            out += ["delay", _ms(self.delay)]
            if self.reorder:
                out += ["reorder", _pct(self.reorder)]
        elif self.reorder:
            # netem's "reorder P" sends P at once and delays the rest: hold back the share asked for instead
            out += ["delay", _ms(self.hold), "reorder", _pct(1.0 - self.reorder)]
        return out

    def describe(self, where: str) -> str:
        """One line for a report's meta and the evidence: the qdisc and where it sat."""
        return f"tc netem {' '.join(self.args())} on {where} (unseeded: the kernel's generator)"


def _pct(p: float) -> str:
    return f"{p * 100:g}%"


def _ms(s: float) -> str:
    return f"{s * 1000:g}ms"


def vm_env(netem: Netem | None) -> str:
    """The ``KVCONFORM_VM_NETEM=...`` prefix of a VM command (empty without netem)."""
    if netem is None:
        return ""
    return f"{VM_ENV}={shlex.quote(' '.join(netem.args()))} "
