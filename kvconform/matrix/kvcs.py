"""The KVCS cell: a publisher publishes a cache spec through a relay, a consumer retrieves it.

The cache is the test-content convention's (``kvconform.kvcs.content``), with a scope key, tokens and
content seed derived from the cell's seed, so every cell publishes under its own namespace (Scope ID,
Compatibility ID, Anchor Key; the publisher picks the Publication ID) and its own token. 10 layers of 4
blocks: more than one manifest cadence (8 layers), small enough for any relay's cache.

1. The relay is started on a free port (or located); not ready: inconclusive.
2. The publisher is started against it with the cache spec and token; it cannot be started: inconclusive.
3. The harness subscribes to the cache's content prefix ("kvcs-1", Scope ID, Compatibility ID, Anchor Key) at
   the relay and waits (bounded) for the publication's NAMESPACE: only then is there something to retrieve.
4. The consumer retrieves the cache through the relay (its own budget); the layer digests of its result are
   compared with those the cache spec implies (``convention_layer_digest``), segment layout included.
5. Both are stopped; what each printed is the cell's evidence, with the consumer's result file.

Pass: every layer's digest is the spec's. Anything else fails; the suspects are the roles the evidence
points at (the one that exited, hung or refused; all three when the content is wrong) and isolation decides.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kvconform.kvcs.consumer import convention_layer_digest
from kvconform.kvcs.content import example_spec
from kvconform.matrix.context import Broken, CellContext, Unavailable
from kvconform.matrix.participants import start_relay, write_certificates
from kvconform.moqt.client import RequestRejected, SessionEnded, connect
from kvconform.moqt.structures import AuthToken
from kvconform.targets.drivers import driver_for
from kvconform.targets.kvcs.consumer import FetchRequest
from kvconform.verdicts import DriverError, TargetUnavailable

__all__ = ["ANNOUNCE_TIMEOUT_S", "GEOMETRY", "run"]

GEOMETRY: dict[str, Any] = {"layers": 10, "blocks": 4, "block_tokens": 16, "kv_heads": 2, "head_dim": 16}
ANNOUNCE_TIMEOUT_S = 30.0  # a publisher process starting (an interpreter, a container) and publishing
CONNECT_TIMEOUT_S = 10.0
P, R, C = "kvcs-publisher", "kvcs-relay", "kvcs-consumer"


async def _await_publication(url: str, prefix: Any, token: bytes, timeout: float) -> tuple[str, Any]:
    """("announced", Publication ID hex) | ("unreachable", why) | ("refused", why) | ("silent", why)."""

    try:
        client = await connect(url, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, ConnectionError, SessionEnded) as exc:
        return "unreachable", f"no MOQT session with {url} within {CONNECT_TIMEOUT_S:g} s: {type(exc).__name__}: {exc}"
    try:
        try:
            sub = await client.subscribe_namespace(prefix, auth=(AuthToken.use_value(token),), timeout=timeout)
        except RequestRejected as exc:
            return "refused", f"SUBSCRIBE_NAMESPACE of the cache's prefix refused: {exc}"
        except (TimeoutError, SessionEnded) as exc:
            return "refused", f"SUBSCRIBE_NAMESPACE of the cache's prefix not answered: {type(exc).__name__}: {exc}"
        try:
            while True:
                kind, suffix = await sub.next(timeout=timeout)
                # The suffix after the prefix is the Publication ID; a relay that sends more is the consumer's problem.
                if kind == "namespace" and suffix.fields and len(suffix.fields[-1]) == 16:
                    return "announced", suffix.fields[-1].hex()
        except (TimeoutError, SessionEnded) as exc:
            return "silent", f"no NAMESPACE under the cache's prefix within {timeout:g} s ({type(exc).__name__})"
    finally:
        await client.close(timeout=CONNECT_TIMEOUT_S)


def _judge(ctx: CellContext, spec: Any, result: Any) -> None:
    full = [(s.segment, s.blocks) for s in spec.segment_layout()]
    layers: list[dict[str, Any]] = []
    for layer in range(spec.layers):
        expected = convention_layer_digest(spec, layer, full).hex()
        got = result.layers.get(layer)
        layers.append({"layer": layer, "expected": expected, "got": got.hex() if got is not None else "failed",
                       "ok": got is not None and got.hex() == expected,
                       "reason": result.reasons.get(layer, "")})
    ctx.exchanged["layers"] = layers
    ctx.exchanged["consumer_mode"] = result.mode
    ctx.exchanged["rejected"] = [r.to_obj() for r in result.rejected[:20]]
    ctx.exchanged["rejected_count"] = len(result.rejected)
    segments = [list(s) for s in result.segments]
    ctx.exchanged["segments"] = {"expected": [list(s) for s in full], "got": segments}
    bad = [entry for entry in layers if not entry["ok"]]
    wrong = [e["layer"] for e in bad if e["got"] != "failed"]
    failed = [e["layer"] for e in bad if e["got"] == "failed"]
    if not bad and segments == [list(s) for s in full]:
        ctx.step("verified", layers=spec.layers, mode=result.mode, rejected=len(result.rejected))
        return
    problems = []
    if wrong:
        problems.append(f"layers {wrong} reported ready with a digest that is not the cache spec's (e.g. layer "
                        f"{wrong[0]}: got {bad[0]['got']}, expected {bad[0]['expected']})")
    if failed:
        reasons = sorted({e["reason"] for e in bad if e["reason"]})[:3]
        problems.append(f"layers {failed} not retrieved (reasons: {reasons or 'none given'})")
    if segments != [list(s) for s in full]:
        problems.append(f"segments used {segments}, expected {[list(s) for s in full]}")
    rejected = [f"{r.track} {{{r.group},{r.object}}}: {r.reason}" for r in result.rejected[:3]]
    raise Broken([P, R, C], "the cache did not arrive intact: " + "; ".join(problems)
                 + (f"; the consumer rejected {len(result.rejected)} objects, e.g. {rejected}" if rejected else ""))


def run(ctx: CellContext) -> None:
    """The KVCS exchange of one cell (see the module docstring)."""

    spec = example_spec(**GEOMETRY, seed=ctx.seed % 2**31, model=f"kvconform-matrix-{ctx.id}")
    cache = spec.write_json(ctx.dir / "cache.json")
    token = f"kvconform-matrix-{ctx.seed:x}"
    prefix = spec.namespace(b"\0" * 16).content_prefix()
    ctx.identifiers.update(scope_id=spec.scope_id.hex(), compat_id=spec.compat_id.hex(),
                           anchor_key=spec.anchor_key.hex(), token=token, cache_spec=cache.name)
    ctx.exchanged["cache_spec"] = {"file": cache.name, **GEOMETRY, "section_octets": spec.section_octets}
    certs = write_certificates(ctx.dir / "certs")
    try:
        relay = start_relay(ctx.spec(R), ctx.part(R).run.ready, certs)
    except TargetUnavailable as exc:
        raise Unavailable(R, str(exc)) from exc
    publisher: Any = None
    try:
        ctx.identifiers["relay"] = relay.url
        ctx.step("relay ready", url=relay.url, argv=relay.argv)
        try:
            publisher = driver_for(P, ctx.spec(P))
            publisher.start(relay.url, cache, token)
        except TargetUnavailable as exc:
            publisher = None
            raise Unavailable(P, str(exc)) from exc
        ctx.step("publisher started", relay=relay.url, cache=cache.name)
        state, detail = asyncio.run(_await_publication(relay.url, prefix, token.encode(), ANNOUNCE_TIMEOUT_S))
        if state == "unreachable":
            raise Unavailable(R, detail)
        if state == "refused":
            raise Broken([R], f"the relay {detail}")
        if state == "silent":
            if not publisher.running():
                ended = publisher.stop()
                ctx.log(P, f"publisher exited {ended.code}",
                        f"---- stdout\n{ended.stdout}\n---- stderr\n{ended.stderr}")
                publisher = None
                if ctx.not_started(P, ended.code):
                    raise Unavailable(P, f"the publisher exited {ended.code} (not startable): {ended.stderr[-500:]!r}")
                raise Broken([P], f"the publisher exited {ended.code} before its publication was announced: "
                                  f"{ended.stderr[-500:]!r}")
            raise Broken([P, R], f"{detail}: the publisher did not publish, or the relay did not announce it "
                                 f"(relay {'running' if relay.alive() else 'exited'})")
        ctx.identifiers["publication"] = detail
        ctx.step("publication announced by the relay", publication=detail)
        try:
            consumer = driver_for(C, ctx.spec(C))
        except TargetUnavailable as exc:
            raise Unavailable(C, str(exc)) from exc
        _consume(ctx, spec, cache, relay.url, token, consumer)
        if not publisher.running():
            ctx.step("note: the publisher had exited before it was stopped (it should serve until stopped)")
        if not relay.alive():
            ctx.step("note: the relay had exited before it was stopped")
    finally:
        if publisher is not None:
            ended = publisher.stop()
            ctx.log(P, f"publisher stopped (exit {ended.code})",
                    f"---- stdout\n{ended.stdout}\n---- stderr\n{ended.stderr}")
        result = relay.stop()
        if result is not None:
            ctx.log_process(R, "relay stopped", {**result.evidence(), "stdout": _text(result.stdout),
                                                 "stderr": _text(result.stderr)})


LOG_OCTETS = 256 * 1024  # of a relay's output kept in its log (the start and the end)


def _text(data: bytes) -> str:
    if len(data) > LOG_OCTETS:
        half = LOG_OCTETS // 2
        data = data[:half] + f"\n[... {len(data) - LOG_OCTETS} octets left out ...]\n".encode() + data[-half:]
    return data.decode("utf-8", "replace")


def _consume(ctx: CellContext, spec: Any, cache: Path, url: str, token: str, consumer: Any) -> None:
    out = ctx.dir / "consumer-result.json"
    request = FetchRequest(relays=(url,), cache=cache, budget=ctx.budget_s, token=token)
    ctx.step("consumer started", relay=url, budget_s=ctx.budget_s)
    try:
        run = consumer.fetch(request, out)
    except TargetUnavailable as exc:
        raise Unavailable(C, str(exc)) from exc
    except DriverError as exc:
        raise Broken([C], f"the consumer failed: {exc}") from exc
    ctx.log(C, f"consumer exit {run.code} after {run.elapsed:.2f} s{' (killed past its budget)' if run.killed else ''}",
            f"---- stdout\n{run.stdout}\n---- stderr\n{run.stderr}")
    ctx.exchanged["consumer_result"] = out.name if out.exists() else None
    ctx.step("consumer ended", code=run.code, elapsed_s=round(run.elapsed, 3), killed=run.killed, error=run.error)
    if run.result is None:
        if ctx.not_started(C, run.code):
            raise Unavailable(C, f"the consumer exited {run.code} (not startable): {run.stderr[-500:]!r}")
        if run.killed:
            raise Broken([C], f"the consumer {run.error}")
        raise Broken([C], f"the consumer left no result it could be judged by (exit {run.code}): {run.error}")
    _judge(ctx, spec, run.result)
