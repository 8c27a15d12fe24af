"""Authorization: which tokens a request presents (Token Aliases, section 3.6) and whether the relay's
``Policy`` grants the right it asks for on a namespace. Token expiry is judged at ``wall_now`` (Unix
seconds), which the adapter passes in; nothing here reads a clock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from kvconform.moqt.errors import RequestErrorCode
from kvconform.moqt.parameters import Parameters
from kvconform.moqt.policy import Decision, Right, TokenKey
from kvconform.moqt.relay.hooks import CoreBase
from kvconform.moqt.relay.state import UNKNOWN_AUTH_TOKEN_ALIAS, Peer, Refusal
from kvconform.moqt.structures import AuthAliasType, AuthToken, ParamType, TrackNamespace

__all__ = ["Authorization"]


class Authorization(CoreBase):
    """The relay's authorization concept (a part of ``RelayCore``)."""

    def _resolve(self, peer: Peer, token: AuthToken) -> TokenKey | None:
        """A token as (type, value) after alias processing (section 3.6); None = nothing to present."""
        if token.alias_type == AuthAliasType.USE_VALUE:
            return TokenKey(token.token_type or 0, token.value)
        if token.alias_type == AuthAliasType.REGISTER:
            key = TokenKey(token.token_type or 0, token.value)
            if token.alias is not None:
                peer.aliases[token.alias] = key
            return key
        if token.alias_type == AuthAliasType.DELETE:
            if token.alias is not None:
                peer.aliases.pop(token.alias, None)
            return None
        alias = peer.aliases.get(token.alias if token.alias is not None else -1)
        if alias is None:
            raise Refusal(UNKNOWN_AUTH_TOKEN_ALIAS, f"Token Alias {token.alias} is not registered (section 3.6)")
        return alias

    def _setup_tokens(self, peer: Peer, tokens: Iterable[AuthToken]) -> list[TokenKey]:
        out: list[TokenKey] = []
        for token in tokens:
            with contextlib.suppress(Refusal):
                key = self._resolve(peer, token)
                if key is not None:
                    out.append(key)
        return out

    def request_tokens(self, peer: Peer, params: Parameters) -> list[TokenKey]:
        """The tokens a request presents: its AUTHORIZATION_TOKEN parameters plus the session's."""
        keys = [self._resolve(peer, t) for t in params.all(ParamType.AUTHORIZATION_TOKEN) if isinstance(t, AuthToken)]
        return [k for k in keys if k is not None] + peer.setup_tokens

    def authorize(self, peer: Peer, right: Right, namespace: TrackNamespace, params: Parameters) -> Decision:
        """May this request use ``right`` on ``namespace`` (a track's, or a SUBSCRIBE_NAMESPACE prefix)?"""
        return self.policy.check(right, namespace.fields, self.request_tokens(peer, params), self.wall_now)

    def _require(self, peer: Peer, right: Right, namespace: TrackNamespace, params: Parameters) -> None:
        decision = self.authorize(peer, right, namespace, params)
        if not decision.allowed:
            raise Refusal(decision.code, decision.reason)

    def _check_track_name(self, namespace: TrackNamespace) -> None:
        if namespace.fields and namespace.fields[0].startswith(b"."):
            raise Refusal(RequestErrorCode.DOES_NOT_EXIST, "namespaces starting with '.' are reserved (section 3.4)")
