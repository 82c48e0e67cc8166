"""Reconnecting to a ferryd that went away (a drain and restart, a crash and a restart by
systemd): the policy a :class:`ferry.Client` follows, and the notices it gives the engine.
The mechanics live in :class:`ferry.connection.Connection`.

    from ferry import Client, Reconnect, Reconnected
    c = Client(sock, reconnect=Reconnect(max_delay=2.0))
    c.on_connection(lambda n: print(n))      # Draining, Disconnected, Reconnected

When the connection to ferryd is lost:

- every request waiting for a reply raises :class:`FerryError` 302 ``peer_lost`` (``ferryd
  closed the connection``);
- every room subscribed on it and not yet terminal gets a Failed event with code 302 and a
  reason saying that ferryd went away (a room does not survive its ferryd: the restarted
  daemon does not know it), delivered like any event and kept for ``wait_terminal``;
- requests made while disconnected raise 300 ``peer_unreachable`` at once, naming the attempt
  and its last error (they do not wait for the reconnect);
- a background thread connects again: the first attempt at once, then after
  ``initial_delay``, growing by ``multiplier`` up to ``max_delay`` between attempts, until it
  succeeds, ``max_attempts`` fail, or the client is closed. It says hello again, registers
  every ``memory: client`` pool this client had registered again (it keeps duplicates of the
  descriptors for that, closed with the client), and maps the daemon's pools that were mapped
  again (a restarted ferryd creates new shm objects, even under the same names: an old mapping
  no longer shares memory with it). Then the client serves requests again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

from .errors import FerryError

_log = logging.getLogger("ferry")


@dataclass(frozen=True)
class Reconnect:
    """How a :class:`ferry.Client` reconnects after losing its ferryd.

    The first attempt is made at once; then ``initial_delay`` seconds pass before the next,
    each wait ``multiplier`` times the one before, at most ``max_delay``. ``max_attempts``
    (None: no limit) ends the reconnecting: the client is then closed for good with the last
    error. A failed attempt is logged to the ``ferry`` logger as a warning the first time and
    then at most once every ``log_every`` seconds (the others at debug level)."""

    initial_delay: float = 0.1
    max_delay: float = 5.0
    multiplier: float = 2.0
    max_attempts: Optional[int] = None
    log_every: float = 30.0

    def __post_init__(self) -> None:
        if not (0 <= self.initial_delay <= self.max_delay):
            raise ValueError(f"Reconnect needs 0 <= initial_delay <= max_delay, got "
                             f"{self.initial_delay} and {self.max_delay}")
        if self.multiplier < 1:
            raise ValueError(f"Reconnect needs multiplier >= 1, got {self.multiplier}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"Reconnect needs max_attempts >= 1 or None, got "
                             f"{self.max_attempts}")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1, 2, ...)."""
        return min(self.max_delay, self.initial_delay * self.multiplier ** (attempt - 1))


@dataclass(frozen=True)
class Draining:
    """ferryd answered a request with 407 ``draining`` (``ferryd is draining: ...``): it is
    stopping. It finishes the rooms it accepted, refuses new ones, then exits and the
    connection ends; send new rooms elsewhere until :class:`Reconnected`."""

    message: str


@dataclass(frozen=True)
class Disconnected:
    """The connection to ferryd was lost (``error`` says how). ``failed_rooms`` are the
    subscribed rooms reported Failed because of it; ``reconnecting`` is False when the client
    will not connect again (reconnecting is off, or ``max_attempts`` ran out: then ``error`` is
    the last attempt's); ``drained`` is True when ferryd had said it was draining."""

    error: FerryError
    failed_rooms: tuple[int, ...] = ()
    reconnecting: bool = True
    drained: bool = False


@dataclass(frozen=True)
class Reconnected:
    """The client is connected again and serves requests: ``generation`` counts connections
    (1 is the first), ``attempts`` and ``downtime`` (seconds) are what it took. ``instance`` is
    the daemon's instance now, ``previous_instance`` before (they differ after a restart).

    ``registered``: the ``memory: client`` pools registered again with the memory they had;
    ``not_registered``: those ferryd refused this time, with its error (e.g. a changed
    layout), which the engine must handle. ``remapped``: the daemon pools that were mapped and
    are now mapped anew: memoryviews taken from ``Client.pool`` before the loss no longer share
    memory with ferryd; take new ones."""

    generation: int
    attempts: int
    downtime: float
    instance: str
    previous_instance: str
    registered: tuple[str, ...] = ()
    not_registered: dict[str, FerryError] = field(default_factory=dict)
    remapped: tuple[str, ...] = ()


ConnectionNotice = Union[Draining, Disconnected, Reconnected]
NoticeCallback = Callable[[ConnectionNotice], None]


def reconnect_policy(reconnect: Union[bool, Reconnect, None]) -> Optional[Reconnect]:
    """The policy a client's ``reconnect`` argument names: True the defaults, False or None
    none."""
    if reconnect is True:
        return Reconnect()
    if reconnect is False or reconnect is None:
        return None
    if not isinstance(reconnect, Reconnect):
        raise TypeError(f"reconnect must be a bool or a ferry.Reconnect, got {reconnect!r}")
    return reconnect


class AttemptLog:
    """Logs failed reconnect attempts without flooding: the first as a warning, then one
    warning per ``every`` seconds that counts the attempts since; the rest at debug level."""

    def __init__(self, what: str, every: float) -> None:
        self.what = what
        self.every = every
        self.since = time.monotonic()
        self.last_warning: Optional[float] = None
        self.quiet = 0  # attempts logged at debug level since the last warning

    def failed(self, attempt: int, error: FerryError, next_in: Optional[float]) -> None:
        now = time.monotonic()
        then = "giving up" if next_in is None else f"next attempt in {next_in:.2f} s"
        if self.last_warning is None or now - self.last_warning >= self.every or next_in is None:
            more = f" ({self.quiet} more attempts failed since the last report)" \
                if self.quiet else ""
            _log.warning("ferry: reconnecting to %s: attempt %d failed after %.1f s down: %s%s; "
                         "%s", self.what, attempt, now - self.since, error, more, then)
            self.last_warning = now
            self.quiet = 0
        else:
            _log.debug("ferry: reconnecting to %s: attempt %d failed: %s; %s", self.what,
                       attempt, error, then)
            self.quiet += 1


__all__ = ["Reconnect", "Draining", "Disconnected", "Reconnected", "ConnectionNotice",
           "NoticeCallback", "reconnect_policy"]
