"""What a host must offer to run a cell or a role suite: the resources of ``kvconform matrix --scheduler``.

A cell is a Dask task restricted to workers that offer every resource it needs (``kvconform worker
--resources "docker=2,nic.mlx5_pair=1"``); the amount a worker offers is how many cells using it may run there
at once. What a cell needs is derived from its participants' run forms, plus what the registry says a role needs
beyond them (``resources:`` of a role entry, e.g. ``{nic.mlx5_pair: 1}``, schema
``testbeds/schema/implementations.schema.json``):

| participant | needs |
| --- | --- |
| ``image:`` (the container contract) or ``cmd:`` with ``docker:`` | ``docker=1`` |
| ``url: kbtp+verbs://...?device=rxe0`` (or ``siw0``: the kernel's soft RDMA, in the testbed VM) | ``rdma-vm=1`` |
| ``url: kbtp+verbs://...?device=mlx5_0`` (any other device) | ``nic.mlx5=1`` (the device name without its index) |
| the reference, ``python:``, other ``cmd:`` and ``url:`` | nothing |

A resource two participants need counts once (the cell holds it while it runs). A cell nothing restricts runs
on any worker. ``missing`` says which resources no worker of the cluster offers, for the inconclusive verdict.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from urllib.parse import parse_qs, urlsplit

from kvconform.matrix.registry import RoleEntry, RunForm

__all__ = ["DOCKER", "RDMA_VM", "form_resources", "missing", "parse_resources", "role_resources", "unite"]

DOCKER = "docker"
RDMA_VM = "rdma-vm"
SOFT_RDMA = ("rxe", "siw")  # the kernel's soft RDMA devices: the testbed VM (spec/rdma-vm-testbed.md)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def form_resources(form: RunForm) -> dict[str, float]:
    """What running ``form`` needs of the host (see the module's table)."""
    need: dict[str, float] = {}
    if form.in_docker:
        need[DOCKER] = 1.0
    if form.kind == "url" and form.value.startswith("kbtp+verbs://"):
        device = (parse_qs(urlsplit(form.value).query).get("device") or [""])[0]
        kind = re.sub(r"[_-]?\d+$", "", device)
        if kind in SOFT_RDMA:
            need[RDMA_VM] = 1.0
        elif kind:
            need[f"nic.{kind}"] = 1.0
    return need


def unite(needs: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Several needs held by one task: each resource once, at the largest amount asked."""
    out: dict[str, float] = {}
    for need in needs:
        for name, amount in need.items():
            out[name] = max(out.get(name, 0.0), float(amount))
    return dict(sorted(out.items()))


def role_resources(entry: RoleEntry, *, suite: bool = False) -> dict[str, float]:
    """What ``entry`` needs in a cell (``suite``: in its role suite, run by its suite form)."""
    return unite([form_resources(entry.suite_run if suite else entry.run), entry.resources])


def missing(need: Mapping[str, float], workers: Mapping[str, Mapping[str, float]]) -> list[str]:
    """The resources of ``need`` no single worker offers (``workers``: name -> what it offers), as ``name=amount``
    (every one of them when each is offered somewhere but no worker offers them all); [] when one worker can."""
    if not need or any(all(offer.get(r, 0.0) >= a for r, a in need.items()) for offer in workers.values()):
        return []
    absent = [f"{r}={a:g}" for r, a in need.items()
              if not any(offer.get(r, 0.0) >= a for offer in workers.values())]
    return absent or [f"{r}={a:g}" for r, a in need.items()]


def parse_resources(text: str) -> dict[str, float]:
    """``"docker=2,nic.mlx5_pair=1"`` (``dask worker --resources``' form, commas or spaces) -> a dict; ValueError
    naming the item that is off."""
    out: dict[str, float] = {}
    for item in re.split(r"[,\s]+", text.strip()):
        if not item:
            continue
        name, eq, amount = item.partition("=")
        try:
            value = float(amount)
        except ValueError:
            value = -1.0
        if not eq or not _NAME.match(name) or value <= 0:
            raise ValueError(f"resource {item!r}: expected NAME=AMOUNT with AMOUNT > 0 (e.g. docker=1)")
        out[name] = value
    return out
