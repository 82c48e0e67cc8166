"""Ferry's Python client (docs/protocol.md), standard library only.

    from ferry import Client, Status
    with Client("/tmp/ferry-decode.sock") as c:
        c.prepare(7, "127.0.0.1:7401", dst_pages=[5, 6, 7], state_slot=2, aux_row=2)
        c.subscribe(7)
        if c.wait_terminal(7, timeout=30).status == Status.Success: ...

- :mod:`ferry.client`: :class:`Client`, thread-safe, several requests in flight, events to
  callbacks and a queue, protocol versions 3 to 10 (``poll_many``, error codes on statuses);
- :mod:`ferry.connection`: the connection under :class:`Client` (hello, seq matching, the
  reader and dispatcher threads, reconnecting);
- :mod:`ferry.reconnect`: :class:`Reconnect`, the policy of a client that reconnects by itself
  when its ferryd comes back, and the notices it gives (:class:`Draining`,
  :class:`Disconnected`, :class:`Reconnected`);
- :mod:`ferry.protocol`: the pure codec (``encode``/``decode``) and the message dataclasses,
  gathered from :mod:`ferry.messages`, :mod:`ferry.encoder`, :mod:`ferry.decoder` and
  :mod:`ferry.frames`;
- :mod:`ferry.errors`: :class:`Errc` and :class:`FerryError`;
- :mod:`ferry.memory`: :class:`MemfdPool`, engine-owned memory for ``memory: client`` pools
  (lent to ferryd with ``Client.register_memory``);
- :mod:`ferry.sglang`: an adapter with SGLang's disaggregation connector names (import it
  explicitly), gathered from :mod:`ferry.sglang.bootstrap`, :mod:`ferry.sglang.kvargs`,
  :mod:`ferry.sglang.manager` and :mod:`ferry.sglang.rooms`.
"""

from pathlib import Path as _Path

from .client import Client, EventCallback
from .errors import EncodeError, Errc, FerryError, ProtocolError, to_errc
from .memory import MemfdPool
from .reconnect import ConnectionNotice, Disconnected, Draining, Reconnect, Reconnected
from .protocol import (MAX_POLL_MANY, MAX_REGISTER_BUFFERS, MAX_REGISTER_FDS,
                       MIN_PROTOCOL_VERSION, NO_INDEX, POOL_KINDS, PROTOCOL_VERSION,
                       SUPPORTED_VERSIONS, Buffer, BufferKind, Event, HelloReply, InfoTopic,
                       MemoryBuffer, MemoryKind, MessageType, Pool, PollReply, PollResult,
                       RegisterMemory, StateType, Status, decode, encode)


def _read_version() -> str:
    """Ferry's one version (the tools print the same), from the file VERSION: beside this
    package once `cmake --install` put it there, at the top of the repository in a checkout;
    a package pip installed asks its own metadata (pip read the version from here)."""
    here = _Path(__file__).resolve().parent
    for f in (here / "VERSION", here.parents[1].parent / "VERSION"):
        if f.is_file():
            return f.read_text().strip()
    from importlib.metadata import version
    return version("ferry-client")


__version__ = _read_version()

__all__ = [
    "Client", "EventCallback", "EncodeError", "Errc", "FerryError", "ProtocolError", "to_errc",
    "MemfdPool", "ConnectionNotice", "Disconnected", "Draining", "Reconnect", "Reconnected",
    "MAX_POLL_MANY", "MAX_REGISTER_BUFFERS", "MAX_REGISTER_FDS",
    "MIN_PROTOCOL_VERSION", "NO_INDEX", "POOL_KINDS", "PROTOCOL_VERSION", "SUPPORTED_VERSIONS",
    "Buffer", "BufferKind", "Event", "HelloReply", "InfoTopic", "MemoryBuffer", "MemoryKind",
    "MessageType", "Pool", "PollReply", "PollResult", "RegisterMemory", "StateType", "Status",
    "decode",
    "encode",
    "__version__",
]
