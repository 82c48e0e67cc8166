"""The client side of one connection to ferryd as a pure machine: no socket, no thread, no
clock. :class:`~ferry.connection.Connection` is the shell around it (the socket, the reader and
dispatcher threads, the waits); the C++ client's ``ferry::proto::client_session``
(src/core/client_session.hpp) is the same machine, and both pass the cases of
tests/conformance/client_session.yaml.

A session numbers the requests it starts (seq 1, 2, ... skipping 0, which is for pushed events,
and any seq still in use) and reads each frame that comes back as one :data:`Outcome`:

- :class:`Reply`: the reply to request ``seq``, of the type that request expects;
- :class:`Refused`: ferryd's error reply to it (``draining`` when it says ferryd itself is
  draining, not a peer it named);
- :class:`Failed`: the reply cannot be taken (its body does not decode, or it is of another
  type): that request fails, and the stream is still in step;
- :class:`Dropped`: the reply to a request whose waiter gave up (:meth:`Session.abandon`);
- :class:`Pushed`: an event (seq 0);
- :class:`Ended`: the connection cannot go on (ferryd's error about the connection itself, or
  a reply that matches no request: taking it for another's would shift every later reply).

The hello is the first request (seq 1); :func:`hello_outcome` says what its answer means,
including when to say hello again in version 3 to a daemon that speaks only that.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple, Union

from .errors import Errc, FerryError, ProtocolError
from .frames import Frame, check_flags
from .decoder import decode
from .encoder import encode
from .messages import (Cancel, Discover, DiscoverReply, Drain, Error, Event, Hello, HelloReply,
                       Info, InfoReply, Message, MessageType, Ok, Poll, PollMany, PollManyReply,
                       PollReply, Prepare, RegisterMemory, Send, SetLogLevel, Subscribe,
                       message_type, type_name)

HELLO_SEQ = 1
"""The seq of a connection's first request, its hello."""

EXPECT: dict[type, type] = {
    Hello: HelloReply, Prepare: Ok, Send: Ok, Poll: PollReply, Cancel: Ok, Subscribe: Ok,
    Info: InfoReply, PollMany: PollManyReply, RegisterMemory: Ok, Discover: DiscoverReply,
    Drain: Ok, SetLogLevel: Ok,
}
"""The reply each request expects (an ``Error`` may answer any)."""


class Reply(NamedTuple):
    seq: int
    token: Any
    message: Message


class Refused(NamedTuple):
    seq: int
    token: Any
    error: FerryError
    draining: bool


class Failed(NamedTuple):
    seq: int
    token: Any
    error: FerryError


class Dropped(NamedTuple):
    seq: int


class Pushed(NamedTuple):
    event: Event


class Ended(NamedTuple):
    error: FerryError


Outcome = Union[Reply, Refused, Failed, Dropped, Pushed, Ended]

_OWN_DRAIN = re.compile(r"(room \d+: )?ferryd is draining")


def own_drain(err: FerryError) -> bool:
    """Whether an error reply says this client's own ferryd is draining (``room 3: ferryd is
    draining: ...``), not a peer it named (``peer HOST:PORT is draining: ...``)."""
    return err.code == Errc.DRAINING and _OWN_DRAIN.match(err.message) is not None


def waiting_text(seqs: list[int]) -> str:
    if not seqs:
        return "no request is outstanding"
    shown = ", ".join(f"seq {s}" for s in seqs[:8])
    more = f" and {len(seqs) - 8} more" if len(seqs) > 8 else ""
    return f"waiting for {shown}{more}"


class _Request(NamedTuple):
    name: str
    expect: type
    token: object


class Framed(NamedTuple):
    """A request encoded, not numbered yet (:meth:`Session.encode`)."""

    name: str
    expect: type
    frame: bytearray


class Taken(NamedTuple):
    """The request a frame answers, taken off the outstanding ones (:meth:`Session.take`)."""

    seq: int
    name: str
    expect: type
    token: Any


class Session:
    """One connection's requests and replies, without I/O. ``token`` is whatever the shell
    wants back with a request's outcome (its waiter)."""

    def __init__(self, version: int) -> None:
        self.version = version
        self._last_seq = 0
        self._pending: dict[int, _Request] = {}
        self._abandoned: set[int] = set()

    def start(self, msg: Message, token: Any) -> tuple[int, bytes]:
        """Number ``msg`` and encode it: its seq and its frame, to be sent now (EncodeError
        when it cannot be encoded: nothing is started). ``encode`` then ``number``."""
        return self.number(self.encode(msg), token)

    def encode(self, msg: Message) -> Framed:
        """``msg``'s frame, not numbered yet (no state: a shell calls it outside its lock).
        Raises EncodeError, or TypeError for a message that is no request."""
        expect = EXPECT.get(type(msg))
        if expect is None:
            raise TypeError(f"{type(msg).__name__} is not a request")
        return Framed(message_type(msg).wire_name, expect, bytearray(encode(msg, 0,
                                                                            self.version)))

    def number(self, framed: Framed, token: Any) -> tuple[int, bytes]:
        """Give an encoded request its seq: the seq and the frame to send now."""
        seq = self._last_seq
        while True:
            seq = seq % 0xFFFFFFFF + 1  # 1..2^32-1: seq 0 is for events
            if seq not in self._pending and seq not in self._abandoned:
                break
        self._last_seq = seq
        self._pending[seq] = _Request(framed.name, framed.expect, token)
        frame = framed.frame
        frame[8:12] = seq.to_bytes(4, "little")
        return seq, bytes(frame)

    def outstanding(self) -> list[int]:
        """The seqs waiting for their replies, in order."""
        return sorted(self._pending)

    def tokens(self) -> list[Any]:
        """The tokens of the requests waiting for their replies, in the order they started."""
        return [r.token for r in self._pending.values()]

    def abandon(self, seq: int) -> bool:
        """The waiter of ``seq`` gave up: its reply, should it come, is dropped. False when
        the reply was already read (its outcome is being delivered)."""
        if self._pending.pop(seq, None) is None:
            return False
        self._abandoned.add(seq)
        return True

    def end(self) -> list[Any]:
        """The connection ended: the tokens of every request still waiting (they fail with
        the connection's error), and nothing is outstanding any more."""
        tokens = self.tokens()
        self._pending.clear()
        self._abandoned.clear()
        return tokens

    def on_frame(self, f: Frame) -> Outcome:
        """What a frame from ferryd means (see the module's list): ``take`` then ``read``."""
        return self.read(f, self.take(f))

    def take(self, f: Frame) -> Union[Taken, Outcome, None]:
        """The state step of a frame: the request it answers, taken off the outstanding ones
        (to be read with :meth:`read`), or its outcome when that needs no body (dropped, or
        the connection ends); None for a frame with seq 0, which answers no request."""
        if f.flags != 0:
            return None  # read says why the connection ends
        if f.seq == 0 and f.type in (MessageType.EVENT, MessageType.ERROR):
            return None
        req = self._pending.pop(f.seq, None)
        if req is not None:
            return Taken(f.seq, req.name, req.expect, req.token)
        if f.seq in self._abandoned:
            self._abandoned.discard(f.seq)
            return Dropped(f.seq)
        return Ended(ProtocolError(
            Errc.MALFORMED_FRAME,
            f"protocol error: ferryd sent a reply of type {type_name(f.type)} ({f.type}) "
            f"with seq {f.seq}, which matches no outstanding request "
            f"({waiting_text(self.outstanding())})"))

    def read(self, f: Frame, taken: Union[Taken, Outcome, None]) -> Outcome:
        """The pure step: decode the frame ``take`` took (no state: a shell calls it outside
        its lock) into its outcome."""
        try:
            check_flags(f)
        except ProtocolError as e:
            return Ended(e)
        if not isinstance(taken, Taken) and taken is not None:
            return taken
        if taken is None:  # an event or an error with seq 0
            try:
                msg = decode(f.type, 0, f.body, self.version)
            except ProtocolError as e:
                return Ended(e)
            if isinstance(msg, Error):  # about the connection itself; ferryd closes it
                return Ended(FerryError(msg.code, msg.message))
            assert isinstance(msg, Event)
            return Pushed(msg)
        try:  # (a hello_reply is laid out by its own version field, whatever this one is)
            msg = decode(f.type, f.seq, f.body, self.version)
        except ProtocolError as e:  # the stream is still in step: only this request fails
            return Failed(f.seq, taken.token, e)
        if isinstance(msg, Error):
            refused = FerryError(msg.code, msg.message)
            return Refused(f.seq, taken.token, refused, own_drain(refused))
        if not isinstance(msg, taken.expect):
            return Failed(f.seq, taken.token, ProtocolError(
                Errc.MALFORMED_FRAME,
                f"protocol error: ferryd answered {taken.name} (seq {f.seq}) with "
                f"{type_name(f.type)}, expected {type_name(message_type(taken.expect))}"))
        return Reply(f.seq, taken.token, msg)


class HelloAccepted(NamedTuple):
    reply: HelloReply


class HelloRefused(NamedTuple):
    error: FerryError
    retry_v3: bool  # say hello again, offering version 3 only, on a new connection


def hello_outcome(outcome: Outcome, lo: int, hi: int
                  ) -> Union[HelloAccepted, HelloRefused, Ended]:
    """What the first outcome of a connection whose hello offered ``lo..hi`` means. A daemon
    that speaks only version 3 cannot read a v4 hello: it answers unsupported_version, or (not
    knowing the trailing min_version) malformed_frame; the client then says hello in v3."""
    if isinstance(outcome, Reply):
        reply = outcome.message
        assert isinstance(reply, HelloReply)
        if not lo <= reply.version <= hi:
            return Ended(ProtocolError(
                Errc.UNSUPPORTED_VERSION,
                f"protocol error: ferryd answered in protocol version {reply.version}, outside "
                f"the range {lo}..{hi} this client offered"))
        return HelloAccepted(reply)
    if isinstance(outcome, Refused):
        retry = hi >= 4 and lo <= 3 and outcome.error.code in (Errc.UNSUPPORTED_VERSION,
                                                               Errc.MALFORMED_FRAME)
        return HelloRefused(outcome.error, retry)
    if isinstance(outcome, Failed):
        return Ended(outcome.error)
    if isinstance(outcome, Ended):
        return outcome
    return Ended(ProtocolError(Errc.MALFORMED_FRAME,
                               "protocol error: ferryd sent an event before its hello_reply"))


__all__ = ["HELLO_SEQ", "EXPECT", "Session", "Framed", "Taken", "Outcome", "Reply", "Refused", "Failed", "Dropped",
           "Pushed", "Ended", "HelloAccepted", "HelloRefused", "hello_outcome", "own_drain",
           "waiting_text"]
