"""The driver of a suite for a target: what ``--target`` names (reference, ``python:``, ``cmd:``, a URL, a
``docker:`` image, a verbs device, a ``sim:`` relay on the deterministic transport) turned into the object a
lane's fixtures drive, through the role's entry in ``ROLES`` (targets/registry.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvconform.loading import import_python_target
from kvconform.targets.registry import ROLES, Role, cmd_roles, load_ref, suite_roles
from kvconform.targets.spec import TargetSpec
from kvconform.verdicts import TargetUnavailable

__all__ = ["DOCKER_DRIVER", "driver_for"]

DOCKER_DRIVER = "kvconform.targets.docker:contract_driver"  # the driver of every role under the container contract


def _python(role: Role, value: str, options: Mapping[str, Any]) -> Any:
    obj = import_python_target(value)
    assert role.interface is not None  # driver_for serves suite roles only
    protocol = load_ref(role.interface)
    if role.adapt is not None:
        adapted = load_ref(role.adapt)(obj, **options)
        if adapted is not None:
            return adapted
    # A class always names a factory (a Protocol check would pass on the class itself, by its attributes).
    if isinstance(obj, type) or (not isinstance(obj, protocol) and callable(obj)):
        try:
            obj = obj()
        except Exception as exc:  # a vendor's factory that cannot build its object: nothing was exchanged
            raise TargetUnavailable(f"python target {value}: its factory raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, protocol):
        raise TargetUnavailable(f"python target {value}: {type(obj).__name__} does not implement "
                                f"{role.interface.rpartition(':')[2]} (the {role.name} driver protocol, "
                                f"{role.interface.partition(':')[0]})")
    return obj


def driver_for(suite: str, target: TargetSpec, *, seed: int = 0, **options: Any) -> Any:
    """The driver of ``suite`` for ``target``; ``options`` go to in-process drivers (reference, python:
    subclasses); ``seed`` (the run's) to a ``sim:`` target's, whose network it schedules. TargetUnavailable when
    the target cannot play the suite as given (nothing was exchanged)."""
    role = ROLES.get(suite)
    if role is None or role.reference is None:
        raise TargetUnavailable(f"no driver for suite {suite!r} (known: {', '.join(sorted(suite_roles()))})")
    if target.kind == "reference":
        return load_ref(role.reference)(**options)
    if target.kind == "python":
        return _python(role, target.value, options)
    if target.kind == "cmd":
        if role.cmd is None or suite not in cmd_roles(target.value):
            raise TargetUnavailable(f"cmd target {target.value!r} cannot play {suite}: {role.describe()}")
        return load_ref(role.cmd)(target.value)
    if target.kind == "url":
        scheme = str(target.params.get("scheme", ""))
        if role.url is None or scheme not in role.url_schemes:
            raise TargetUnavailable(f"target {target.value} cannot play {suite}: {role.describe()}")
        return load_ref(role.url)(target.value)
    if target.kind == "docker":  # named, like every driver of the table: it brings the TLS stack (aioquic)
        return load_ref(DOCKER_DRIVER)(suite, target)
    if target.kind == "sim":
        if role.sim is None:
            raise TargetUnavailable(f"sim target {target.name} cannot play {suite}: {role.describe()}")
        return load_ref(role.sim)(suite, target, seed, **options)
    if target.kind == "verbs":
        if role.verbs is None:
            raise TargetUnavailable(f"verbs target {target.name} cannot play {suite}: {role.describe()}")
        return load_ref(role.verbs)(target)
    raise TargetUnavailable(f"target {target.name} ({target.kind}) cannot play {suite}: {role.describe()}")
