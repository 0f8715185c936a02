"""Render the HTTP side's own counts: connections open, and what the listener and basic auth refused.

The counts live on the daemon's side (`exporter.serve.listener.ListenerStats`, `exporter.serve.auth.BasicAuth`);
this module only names them, so export imports nothing of the web side.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client.metrics_core import Metric

from exporter import catalogue as c


class ListenerCounts(Protocol):
    """What the listener counts (ListenerStats)."""

    @property
    def open(self) -> int: ...
    @property
    def refused_total(self) -> int: ...
    @property
    def timed_out_total(self) -> int: ...
    @property
    def tls_failed_total(self) -> int: ...
    @property
    def evicted_total(self) -> int: ...
    @property
    def write_timed_out_total(self) -> int: ...


class AuthCounts(Protocol):
    """What basic auth counts (BasicAuth)."""

    @property
    def failures(self) -> int: ...
    @property
    def refused(self) -> int: ...


# The families this module renders (HttpCollector).
SELF_FAMILIES: tuple[c.MetricSpec, ...] = (c.HTTP_CONNECTIONS, c.HTTP_REFUSED_TOTAL)


class HttpCollector:
    """Render the listener's and basic auth's counts: connections open, and what was refused."""

    def __init__(
        self, listener: ListenerCounts, auth: AuthCounts | None, bad_requests: Callable[[], int] = lambda: 0
    ) -> None:
        self.listener = listener
        self.auth = auth
        self.bad_requests = bad_requests  # malformed requests aiohttp answered 400 (counted where logged)

    def collect(self) -> Iterator[Metric]:
        """Yield the open connections and the refusals by cause."""
        conns = c.gauge(c.HTTP_CONNECTIONS)
        conns.add_metric([], self.listener.open)
        yield conns
        refused = c.counter(c.HTTP_REFUSED_TOTAL)
        refused.add_metric(["connection_limit"], self.listener.refused_total)
        refused.add_metric(["header_timeout"], self.listener.timed_out_total)
        refused.add_metric(["tls_handshake"], self.listener.tls_failed_total)
        refused.add_metric(["idle_evicted"], self.listener.evicted_total)
        refused.add_metric(["write_timeout"], self.listener.write_timed_out_total)
        refused.add_metric(["bad_request"], self.bad_requests())
        if self.auth is not None:
            refused.add_metric(["auth_failed"], self.auth.failures)
            refused.add_metric(["auth_rate_limited"], self.auth.refused)
        yield refused
