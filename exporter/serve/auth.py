"""HTTP basic auth for the app: constant-time checks off the event loop, a rate limit on failures (users: exporter.webconfig)."""

from __future__ import annotations

import asyncio
import base64
import collections
import concurrent.futures
import hashlib
import hmac
import ipaddress
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from exporter.webconfig import BCRYPT_PREFIXES

log = structlog.get_logger("boundwatch.web")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def password_matches(stored: str, password: str) -> bool:
    """Return whether a password matches a stored bcrypt or SHA-256 hash (slow for bcrypt, by design)."""
    if stored.startswith(BCRYPT_PREFIXES):
        import bcrypt

        try:
            return bool(bcrypt.checkpw(password.encode(), stored.encode()))
        except ValueError:  # a malformed hash matches nothing
            return False
    return hmac.compare_digest(stored, hashlib.sha256(password.encode()).hexdigest())


def _cost(stored: str) -> int:
    """Return a bcrypt hash's cost (log2 rounds), 0 for SHA-256."""
    if stored.startswith(BCRYPT_PREFIXES) and stored[4:6].isdigit():
        return int(stored[4:6])
    return 0


def client_network(address: str) -> str:
    """Return the network a client address counts in for the failure limit: its /24 (IPv4), /64 (IPv6), or loopback.

    Any local user can send from every address of 127.0.0.0/8, and a host's own IPv6 /64 is as cheap
    to walk; an address that is not one (a Unix socket's '') counts as itself.
    """
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address[:64]
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    prefix = 24 if ip.version == 4 else 64
    return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))


class BasicAuth:
    """Check basic-auth credentials in the same time whatever the user, and rate-limit failures.

    - An unknown user is checked against a dummy hash of the costliest stored kind, and when any
      stored hash is bcrypt every check runs one bcrypt: a wrong user and a wrong password take
      the same time, so timing enumerates nobody.
    - bcrypt (~0.1-0.3 s) runs in at most `at_once` worker threads, never on the event loop, and at
      most `2 * at_once` checks run or wait at once (past them: 429 without a check).
    - Each client network (its /24, or /64 for IPv6, loopback as one) has a token bucket of `burst`
      checks refilled at `rate` per second, and all clients share one `shared` times larger: a check
      takes a token from both (returned when it succeeds); an empty bucket answers 429 without a
      check, so a wrong-password flood, even from addresses that change at every request, costs a
      few checks a second, not the cores, and a new client waits behind a few checks at most.
    - Accepted credentials are remembered (a SHA-256 of user, hash and password, at most
      `remember`) and pass without a check or a token; failures are never remembered.
    """

    def __init__(
        self,
        users: dict[str, str],
        burst: int = 10,
        rate: float = 0.5,
        at_once: int = 2,
        clock: Callable[[], float] = time.monotonic,
        remember: int = 64,
        addresses: int = 4096,
        shared: int = 4,
    ) -> None:
        self.users = users
        self._burst, self._rate, self._clock = float(burst), rate, clock
        self._remember, self._addresses = remember, addresses
        self._accepted: dict[bytes, None] = {}
        self._buckets: collections.OrderedDict[str, list[float]] = collections.OrderedDict()
        # one bucket all clients share, `shared` times a client's: addresses that change cannot outrun it
        self._shared_burst, self._shared_rate = float(burst * shared), rate * shared
        self._shared = [self._shared_burst, clock()]
        costs = {_cost(h) for h in users.values()}
        cost = max(costs, default=0)
        self._bcrypt = cost > 0
        if len(costs) > 1:  # each check takes its user's own cost: the time of a wrong password tells it
            log.warning(
                "basic_auth_costs_differ",
                costs=sorted(costs),
                detail="a wrong password's check takes as long as its user's hash cost, so timing "
                "tells users of a lower cost from unknown ones: hash every user at one cost",
            )
        if self._bcrypt:
            import bcrypt

            self._dummy = bcrypt.hashpw(b"boundwatch-dummy", bcrypt.gensalt(rounds=cost)).decode()
        else:
            self._dummy = hashlib.sha256(b"boundwatch-dummy").hexdigest()
        self._pool = concurrent.futures.ThreadPoolExecutor(at_once, thread_name_prefix="basic-auth")
        self._queue, self._in_flight = 2 * at_once, 0  # checks running or waiting for a thread, at most
        self.checks = 0  # checks run, for tests and the bench
        self.refused = 0  # answered 429 without a check
        self.failures = 0  # checks that failed

    def verify(self, user: str, password: str) -> bool:
        """Check one user's password in the calling thread, taking the same time for any user."""
        stored = self.users.get(user)
        ok = password_matches(stored if stored is not None else self._dummy, password)
        if self._bcrypt and stored is not None and not stored.startswith(BCRYPT_PREFIXES):
            password_matches(self._dummy, password)  # a SHA-256 user: the same cost as a bcrypt user's check
        return ok and stored is not None

    def _take(self, address: str) -> bool:
        """Take a check's token from the client's network's bucket and from the one all share."""
        now = self._clock()
        key = client_network(address)
        bucket = self._buckets.pop(key, None) or [self._burst, now]
        bucket[0] = min(self._burst, bucket[0] + (now - bucket[1]) * self._rate)
        bucket[1] = now
        self._buckets[key] = bucket
        while len(self._buckets) > self._addresses:
            self._buckets.popitem(last=False)
        shared = self._shared
        shared[0] = min(self._shared_burst, shared[0] + (now - shared[1]) * self._shared_rate)
        shared[1] = now
        if bucket[0] < 1 or shared[0] < 1:
            return False
        bucket[0] -= 1
        shared[0] -= 1
        return True

    def _give_back(self, address: str) -> None:
        bucket = self._buckets.get(client_network(address))
        if bucket is not None:
            bucket[0] = min(self._burst, bucket[0] + 1)
        self._shared[0] = min(self._shared_burst, self._shared[0] + 1)

    async def allowed(self, header: str, address: str) -> int:
        """Return 200 when the Authorization header is good, else 401 or 429."""
        if not header.startswith("Basic "):
            return 401
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            user, password = "", ""
        key = hashlib.sha256(f"{user}\0{self.users.get(user)}\0{password}".encode()).digest()
        if key in self._accepted:
            return 200
        if self._in_flight >= self._queue or not self._take(address):
            self.refused += 1
            return 429
        self.checks += 1
        self._in_flight += 1
        try:
            ok = await asyncio.get_running_loop().run_in_executor(self._pool, self.verify, user, password)
        finally:
            self._in_flight -= 1
        if not ok:
            self.failures += 1
            return 401
        self._give_back(address)
        if len(self._accepted) >= self._remember:
            self._accepted.pop(next(iter(self._accepted)))
        self._accepted[key] = None
        return 200

    def close(self) -> None:
        """Stop the worker threads (a check still running finishes on its own)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def basic_auth_middleware(auth: BasicAuth) -> Callable[..., Any]:
    """Return a middleware that demands HTTP basic auth for every path but /healthz."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/healthz":
            return await handler(request)
        status = await auth.allowed(request.headers.get("Authorization", ""), request.remote or "")
        if status == 200:
            return await handler(request)
        if status == 429:
            return web.Response(status=429, text="too many failed logins\n", headers={"Retry-After": "2"})
        return web.Response(status=401, headers={"WWW-Authenticate": 'Basic realm="boundwatch"'})

    return middleware
