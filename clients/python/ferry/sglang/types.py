"""The SGLang adapter's types (see :mod:`ferry.sglang`): SGLang's ``KVPoll`` numbers, its
failure texts, its ``KVTransferError`` and ``KVTransferMetric``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..errors import Errc, FerryError
from ..protocol import Status

KVPoll = Status
"""SGLang's ``KVPoll``: Failed 0, Bootstrapping 1, WaitingForInput 2, Transferring 3,
Success 4 (``KVPoll.Failed`` etc. are ints)."""

ABORTED = "Aborted by AbortReq."
"""SGLang's failure reason of an aborted request."""
FROM_ANOTHER_RANK = "Failed due to an unknown reason from another rank"
"""SGLang's reason when this rank saw no failure but another rank did."""


class FerryKVTransferError(FerryError):
    """A failed request, as SGLang's ``KVTransferError``: ``bootstrap_room``, ``failure_reason``,
    ``is_from_another_rank``, plus ferryd's error ``code`` (an :class:`Errc`)."""

    def __init__(self, bootstrap_room: int, failure_reason: str, code: int = Errc.INTERNAL,
                 is_from_another_rank: bool = False) -> None:
        super().__init__(code, failure_reason)
        self.bootstrap_room = bootstrap_room
        self.failure_reason = failure_reason
        self.is_from_another_rank = is_from_another_rank

    def __str__(self) -> str:
        return (f"KVTransferError(bootstrap_room={self.bootstrap_room}): "
                f"[{int(self.code)}] {self.failure_reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (FerryKVTransferError, (self.bootstrap_room, self.failure_reason, int(self.code),
                                       self.is_from_another_rank))


@dataclass
class FerryTransferMetric:
    """SGLang's ``KVTransferMetric``, as :meth:`FerryKVSender.get_transfer_metric` fills it.
    ferryd reports no event times (poll, events and ``info`` carry statuses only), so the
    latencies are the times this adapter observed: ``alloc_latency_s`` from the sender's
    creation to the first poll that said WaitingForInput or later (the wait for the decode to
    allocate and prepare), ``transfer_latency_s`` from the first chunk handed to ferryd to the
    first poll that said Success; None until observed. ``transfer_total_bytes``: the pages sent
    times the bytes of a page (``kv_item_lens``), plus the Mamba slot's bytes
    (``state_item_lens``) once the last chunk is sent."""

    transfer_latency_s: Optional[float] = None
    alloc_latency_s: Optional[float] = None
    transfer_total_bytes: Optional[int] = None


__all__ = ["KVPoll", "ABORTED", "FROM_ANOTHER_RANK", "FerryKVTransferError",
           "FerryTransferMetric"]
