"""Per-team API tokens, stored hashed, and who may do what.

Three roles: `admin` (quotas, prices, nodes, tokens, every team's jobs), `team` (its own jobs
only) and `agent` (registers nodes and sends heartbeats, nothing else: an agent token reaches
the node endpoints only). A running job also gets a job token (in `ARBITER_JOB_TOKEN`) that can
only report telemetry for that job, so the SDK never needs the team's token.

Tokens are 256-bit random strings, stored as their unsalted SHA-256 on purpose: with that much
entropy there is no dictionary to guess from, so a salt or a slow hash would add nothing but
CPU on every request. A looked-up hash is compared with `hmac.compare_digest`. Failed
authentications are counted per client address: past `max_failures` in a minute, the address
gets 429 (with Retry-After) for any token not already known good.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import insert, select
from sqlalchemy.engine import Engine

from gpu_arbiter.control.store import TokenRow
from gpu_arbiter.domain import ArbiterError

ROLES = ("admin", "team", "agent")


class Unauthorized(ArbiterError):
    """No token, or one that is unknown or revoked (HTTP 401)."""


class Forbidden(ArbiterError):
    """A valid token that may not do this (HTTP 403)."""


class TooManyFailures(ArbiterError):
    """Too many failed authentications from one client address (HTTP 429)."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(
            f"too many failed authentications from this address; retry in {retry_after_s} s"
        )
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class Principal:
    role: str
    team: str | None
    token_id: int

    @property
    def actor(self) -> str:
        """How the audit log names whoever acted."""
        return f"{self.role}:{self.team}" if self.team else f"{self.role}#{self.token_id}"

    def require_admin(self) -> None:
        if self.role != "admin":
            raise Forbidden("this needs an admin token")

    def may_act_for(self, team: str) -> bool:
        return self.role == "admin" or (self.role == "team" and self.team == team)

    def require_user(self) -> Principal:
        """Refuse agent tokens: they reach the node endpoints only, so a token stolen from a
        node cannot read the ledger, the teams or anyone's jobs."""
        if self.role == "agent":
            raise Forbidden("an agent token reaches the node endpoints only")
        return self


def new_token(prefix: str = "arb") -> str:
    return f"{prefix}_{secrets.token_urlsafe(32)}"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class FailureLimit:
    """Failed authentications per client address in the last `window_s` seconds."""

    def __init__(self, max_failures: int, window_s: float = 60.0) -> None:
        if max_failures < 1:
            raise ValueError(f"max_failures must be >= 1, got {max_failures}")
        self.max_failures = max_failures
        self.window_s = window_s
        self._seen: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def check(self, client: str | None) -> None:
        """Raise TooManyFailures while `client` has used up its failures."""
        if client is None:
            return
        now = time.monotonic()
        with self._lock:
            times = self._recent(client, now)
            if times is not None and len(times) >= self.max_failures:
                raise TooManyFailures(max(1, math.ceil(times[0] + self.window_s - now)))

    def failed(self, client: str | None) -> None:
        if client is None:
            return
        now = time.monotonic()
        with self._lock:
            if len(self._seen) > 10_000:  # forget addresses whose window has passed
                for addr in list(self._seen):
                    self._recent(addr, now)
            self._seen.setdefault(client, deque()).append(now)

    def _recent(self, client: str, now: float) -> deque[float] | None:
        times = self._seen.get(client)
        if times is None:
            return None
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._seen[client]
            return None
        return times


class Authenticator:
    """Resolves bearer tokens to principals. Lookups are cached by hash; the control loop
    calls `forget` when it revokes a token, so a revoked token stops working at once.

    `client` is the caller's address, for the failure limit; a known-good token is never
    limited."""

    def __init__(self, db: Engine, max_failures_per_minute: int = 30) -> None:
        self.db = db
        self.limit = FailureLimit(max_failures_per_minute)
        self._cache: dict[str, Principal] = {}
        self._lock = threading.Lock()

    def principal(self, authorization: str | None, client: str | None = None) -> Principal:
        """The principal of an `Authorization` header; reads the database on a cache miss."""
        digest = self._digest(authorization, client)
        with self._lock:
            hit = self._cache.get(digest)
        if hit is not None:
            return hit
        self.limit.check(client)
        with self.db.connect() as conn:
            row = conn.execute(
                select(TokenRow.id, TokenRow.hash, TokenRow.role, TokenRow.team).where(
                    TokenRow.hash == digest, TokenRow.revoked_at.is_(None)
                )
            ).first()
        if row is None or not hmac.compare_digest(row.hash, digest):
            self.limit.failed(client)
            raise Unauthorized("unknown or revoked token")
        found = Principal(role=row.role, team=row.team, token_id=row.id)
        with self._lock:
            self._cache[digest] = found
        return found

    def cached(self, authorization: str | None, client: str | None = None) -> Principal | None:
        """The principal if the token was seen before, without touching the database (None on
        a miss; a malformed header raises Unauthorized). The API's event loop calls this so a
        known token costs one SHA-256 and a dict lookup, not a trip through a worker thread."""
        digest = self._digest(authorization, client)
        with self._lock:
            return self._cache.get(digest)

    def _digest(self, authorization: str | None, client: str | None) -> str:
        try:
            return _digest(authorization)
        except Unauthorized:
            if authorization:  # a malformed token is a failed guess; no token is not
                self.limit.check(client)
                self.limit.failed(client)
            raise

    def forget(self, token_id: int) -> None:
        with self._lock:
            for digest, p in list(self._cache.items()):
                if p.token_id == token_id:
                    del self._cache[digest]


def _digest(authorization: str | None) -> str:
    if not authorization:
        raise Unauthorized("missing Authorization: Bearer <token> header")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Authorization header must be 'Bearer <token>'")
    return hash_token(token.strip())


def bootstrap_admin(db: Engine, token: str | None, token_file: Path, now: float) -> str | None:
    """Make sure an admin can log in on a fresh database.

    With `token` (from --admin-token or ARBITER_ADMIN_TOKEN) that token is made an admin token
    if it is not one yet. Without it, a new admin token is created only when the database has
    none, written to `token_file` (mode 0600) and returned so the server can print it once.
    """
    with db.begin() as conn:
        if token is not None:
            digest = hash_token(token)
            if conn.execute(select(TokenRow.id).where(TokenRow.hash == digest)).first() is None:
                conn.execute(
                    insert(TokenRow).values(
                        hash=digest, role="admin", team=None, label="bootstrap", created_at=now
                    )
                )
            return None
        admin = select(TokenRow.id).where(TokenRow.role == "admin", TokenRow.revoked_at.is_(None))
        if conn.execute(admin).first() is not None:
            return None
        token = new_token()
        conn.execute(
            insert(TokenRow).values(
                hash=hash_token(token), role="admin", team=None, label="bootstrap", created_at=now
            )
        )
    token_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token
