"""Compatibility module: the names of the former single-file client, now in the ``ferry``
package (clients/python/ferry/). New code should ``import ferry``.

    from ferry_client import Client
    c = Client("/tmp/ferry-decode.sock")          # connects and says hello (versions 3..7)
    c.prepare(room=7, prefill_peers=["127.0.0.1:7401"], dst_pages=[5, 6, 7], state_slot=2, aux_row=2)
    c.subscribe(7); ev = c.wait_terminal(7, timeout=30)   # Event(room, status, code, reason)
    c.pool("kv")[off:off + n]                      # memoryview of the mapped pool

``Client`` is :class:`ferry.Client`: thread-safe, several requests in flight matched by seq (a
reply whose seq matches no outstanding request is a protocol error, FerryError 310); a daemon
error raises ``FerryError(code, message)``. ``Event`` now also carries ``code`` (None on a
version-3 connection), and pushed events are read with ``wait_terminal``, ``on_event`` or
``events()`` (a queue) instead of the former ``events`` list.
"""

from ferry import (NO_INDEX, POOL_KINDS, Buffer, Client, EncodeError, Errc,
                   FerryError, PollResult, Pool, ProtocolError, Status)
from ferry.protocol import Event, MessageType

PROTOCOL_VERSION = 4  # the highest version spoken
MIN_PROTOCOL_VERSION = 3
STATUS = {int(s): s.name for s in (Status.Failed, Status.Bootstrapping, Status.WaitingForInput,
                                   Status.Transferring, Status.Success)}
FAILED, BOOTSTRAPPING, WAITING_FOR_INPUT, TRANSFERRING, SUCCESS = (
    Status.Failed, Status.Bootstrapping, Status.WaitingForInput, Status.Transferring,
    Status.Success)
POOLS = POOL_KINDS

HELLO, PREPARE, SEND, POLL, CANCEL, SUBSCRIBE, INFO, POLL_MANY = (
    MessageType.HELLO, MessageType.PREPARE, MessageType.SEND, MessageType.POLL,
    MessageType.CANCEL, MessageType.SUBSCRIBE, MessageType.INFO, MessageType.POLL_MANY)
OK, ERROR, HELLO_REPLY, POLL_REPLY, INFO_REPLY, EVENT, POLL_MANY_REPLY = (
    MessageType.OK, MessageType.ERROR, MessageType.HELLO_REPLY, MessageType.POLL_REPLY,
    MessageType.INFO_REPLY, MessageType.EVENT, MessageType.POLL_MANY_REPLY)

__all__ = [
    "Client", "FerryError", "ProtocolError", "EncodeError", "Errc", "Status", "Event",
    "PollResult", "Buffer", "Pool", "PROTOCOL_VERSION", "MIN_PROTOCOL_VERSION", "NO_INDEX",
    "STATUS", "FAILED", "BOOTSTRAPPING", "WAITING_FOR_INPUT", "TRANSFERRING", "SUCCESS", "POOLS",
    "HELLO", "PREPARE", "SEND", "POLL", "CANCEL", "SUBSCRIBE", "INFO", "POLL_MANY", "OK", "ERROR",
    "HELLO_REPLY", "POLL_REPLY", "INFO_REPLY", "EVENT", "POLL_MANY_REPLY",
]
