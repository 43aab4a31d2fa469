"""API-key authentication: keys kept only as sha256 digests and compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gateway.errors import AuthenticationError, PermissionDeniedError
from gateway.settings import GatewaySettings

logger = logging.getLogger(__name__)

ANONYMOUS = "anonymous"
MISSING_KEY = ("You didn't provide an API key. You need to provide your API key in an Authorization header "
               "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
INVALID_KEY = "Incorrect API key provided."


@dataclass(frozen=True)
class Principal:
    key_id: str  # short hash of the key (or "anonymous"): safe to log and store
    is_admin: bool = False


def key_id(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def load_api_keys(settings: GatewaySettings) -> list[str]:
    keys = [k.strip() for k in (settings.api_keys or "").split(",") if k.strip()]
    if settings.api_keys_file:
        for line in Path(settings.api_keys_file).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                keys.append(line)
    return keys


class ApiKeyAuth:
    """API keys for /v1, a separate admin key for /admin. With no keys at all, everything is open."""

    def __init__(self, api_keys: Iterable[str] = (), admin_key: str | None = None) -> None:
        self._digests = [_digest(k) for k in api_keys]
        self._admin_digest = _digest(admin_key) if admin_key else None

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> ApiKeyAuth:
        return cls(load_api_keys(settings), settings.admin_key)

    @property
    def open(self) -> bool:
        return not self._digests and self._admin_digest is None

    def _is_api_key(self, digest: bytes) -> bool:
        matched = False
        for stored in self._digests:  # no early exit: the time does not depend on which key matched
            matched |= hmac.compare_digest(stored, digest)
        return matched

    def _is_admin_key(self, digest: bytes) -> bool:
        return self._admin_digest is not None and hmac.compare_digest(self._admin_digest, digest)

    def authenticate(self, authorization: str | None) -> Principal:
        """For /v1: a valid API key or the admin key; anyone when no API keys are configured."""
        token = bearer_token(authorization)
        if token is not None:
            digest = _digest(token)
            if self._is_admin_key(digest):
                return Principal(key_id(token), is_admin=True)
            if self._is_api_key(digest):
                return Principal(key_id(token))
        if not self._digests:
            return Principal(key_id(token) if token else ANONYMOUS, is_admin=self.open)
        raise AuthenticationError(MISSING_KEY if token is None else INVALID_KEY)

    def authenticate_admin(self, authorization: str | None) -> Principal:
        """For /admin: 401 without a valid key, 403 with a valid non-admin key."""
        if self.open:
            return Principal(ANONYMOUS, is_admin=True)
        token = bearer_token(authorization)
        if token is None:
            raise AuthenticationError(MISSING_KEY)
        digest = _digest(token)
        if self._is_admin_key(digest):
            return Principal(key_id(token), is_admin=True)
        if self._is_api_key(digest):
            raise PermissionDeniedError("This endpoint requires the admin key.")
        raise AuthenticationError(INVALID_KEY)

    def warn_if_open(self) -> None:
        if self.open:
            logger.warning("no API keys configured: the API and /admin are open to anyone who can reach this port")
        elif self._admin_digest is None:
            logger.warning("no admin key configured (SPECSERVE_ADMIN_KEY): /admin endpoints are disabled")
