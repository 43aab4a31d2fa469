"""Policy administration shared by every replica.

A change is validated and applied by this replica's engine (``EngineClient.update_policy``), then
persisted in Redis (so a replica that starts later adopts it) and published on a channel that every
replica subscribes to at start-up, so each applies it within a moment. Without Redis the change is
local. The subscriber survives Redis outages: it counts the error, backs off and resubscribes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Callable
from typing import Any

from gateway.engine_client import EngineClient
from gateway.errors import BadRequestError
from gateway.redis_guard import REDIS_FAILURES, RedisGuard
from gateway.request_store import KEY_PREFIX

logger = logging.getLogger(__name__)

POLICY_KEY = KEY_PREFIX + "policy"
POLICY_CHANNEL = KEY_PREFIX + "policy-updates"


def apply_policy(engine: EngineClient, changes: dict[str, Any], *, replace: bool) -> dict[str, Any]:
    """PATCH (or, with ``replace``, PUT: every current field must be given) -> the new settings; 400 if invalid."""
    if replace:
        missing = sorted(set(engine.policy_settings()) - set(changes))
        if missing:
            raise BadRequestError(
                f"PUT replaces the whole policy; missing field '{missing[0]}' (use PATCH to change some fields).",
                param=missing[0],
            )
    try:
        return engine.update_policy(changes)
    except ValueError as exc:
        raise BadRequestError(str(exc), param=_field_named(exc, changes), code="invalid_policy") from exc


def _field_named(exc: ValueError, changes: dict[str, Any]) -> str | None:
    """The field a policy error is about: an explicit attribute, else the "field: ..." message prefix."""
    explicit = getattr(exc, "field", None) or getattr(exc, "param", None)
    if explicit:
        return str(explicit)
    match = re.match(r"\s*([A-Za-z_]\w*)\s*:", str(exc))
    if match:
        return match.group(1)
    return next((name for name in changes if name in str(exc)), None)


class PolicyBroker:
    def __init__(self, get_engine: Callable[[], EngineClient | None], guard: RedisGuard | None, replica_id: str,
                 *, retry_s: float = 1.0) -> None:
        self._get_engine = get_engine
        self.guard = guard
        self.replica_id = replica_id
        self.retry_s = retry_s
        self.num_remote_updates = 0
        self._listener: asyncio.Task | None = None
        self._first_attempt = asyncio.Event()  # set once subscribing first succeeded or failed

    async def start(self) -> None:
        """Adopt the persisted policy, then subscribe (waiting for the first attempt so no update is missed)."""
        if self.guard is None:
            return
        raw = await self.guard.call("policy_load", lambda r: r.get(POLICY_KEY), None)
        if raw:
            self._apply_remote(json.loads(raw), source="persisted policy")
        self._listener = asyncio.create_task(self._listen())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._first_attempt.wait(), timeout=2.0)

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener

    async def update(self, engine: EngineClient, changes: dict[str, Any], *, replace: bool) -> dict[str, Any]:
        settings = apply_policy(engine, changes, replace=replace)
        if self.guard is not None:
            message = json.dumps({"origin": self.replica_id, "changes": changes})
            await self.guard.call("policy_save", lambda r: r.set(POLICY_KEY, json.dumps(settings)), None)
            await self.guard.call("policy_publish", lambda r: r.publish(POLICY_CHANNEL, message), 0)
        return settings

    async def _listen(self) -> None:
        assert self.guard is not None
        while True:
            pubsub = self.guard.client.pubsub()
            try:
                await pubsub.subscribe(POLICY_CHANNEL)
                self._first_attempt.set()
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None:
                        self._on_message(message.get("data"))
            except REDIS_FAILURES as exc:
                self.guard.record_failure("policy_subscribe", exc)
                self._first_attempt.set()
                await asyncio.sleep(self.retry_s)
            except Exception:  # never let a bug end the subscription for good
                logger.exception("policy subscriber failed; resubscribing")
                self._first_attempt.set()
                await asyncio.sleep(self.retry_s)
            finally:
                with contextlib.suppress(*REDIS_FAILURES):
                    await pubsub.aclose()

    def _on_message(self, data: Any) -> None:
        try:
            message = json.loads(data)
        except (TypeError, ValueError):
            logger.warning("ignoring a malformed policy message: %r", data)
            return
        if message.get("origin") != self.replica_id:
            self._apply_remote(message.get("changes") or {}, source=f"replica {message.get('origin')}")

    def _apply_remote(self, changes: dict[str, Any], *, source: str) -> None:
        engine = self._get_engine()
        if engine is None:
            return
        try:
            engine.update_policy(changes)
        except ValueError as exc:
            logger.warning("not applying policy from %s: %s", source, exc)
            return
        self.num_remote_updates += 1
        logger.info("applied policy update from %s: %s", source, changes)
