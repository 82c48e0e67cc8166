"""An SGLang-shaped adapter over Ferry: SGLang's disaggregation connector names and call order
(``python/sglang/srt/disaggregation/base/conn.py``), each call mapped onto the local ferryd.

One :class:`FerryKVManager` per engine rank holds one :class:`~ferry.client.Client` to that
rank's ferryd and, at construction, lends it the engine's memory for every pool the daemon's
config marks ``memory: client`` (register_memory). Per request (``bootstrap_room``):

===============================================  ================================================
SGLang (decode side)                             Ferry
===============================================  ================================================
``KVReceiver(mgr, bootstrap_addr, room)``        local only; :meth:`~FerryKVReceiver.poll` says
                                                 Bootstrapping
``receiver.init(prefill_dp_rank)``               :class:`FerryBootstrap` names the control
                                                 addresses of every rank of the prefill
                                                 instance; WaitingForInput (local)
``receiver.send_metadata(page_indices,           **one** ``prepare(room, those addresses,
aux_index, state_indices, decode_prefix_len)``   dst_pages=page_indices, state_slot, aux_row,
                                                 prefix_tokens=decode_prefix_len,
                                                 state_pages)``; ferryd picks the ranks the
                                                 geometry needs
``receiver.poll()``                              ``poll`` (or :func:`poll_all`: ``poll_many``)
``receiver.abort()``                             ``cancel``, and return at once; ``poll()`` says
                                                 Failed once ferryd reports the room terminal
                                                 (its writes drained)
===============================================  ================================================

===============================================  ================================================
SGLang (prefill side)                            Ferry
===============================================  ================================================
``KVSender(mgr, bootstrap_addr, room,            local only; :meth:`~FerryKVSender.poll` asks
dest_tp_ranks, pp_rank)``                        ferryd, which answers Bootstrapping until the
                                                 decode's prepare arrived, then WaitingForInput
``sender.pop_decode_prefix_len()``               the decode's ``decode_prefix_len`` for this
                                                 room: the ``prefix_tokens`` of the last poll
``sender.init(num_pages, aux_index)``            local: the pages the room will send, its aux row
``sender.send(page_indices, state_indices)``     one ``send`` per chunk; the chunk that brings
                                                 the pages sent to ``num_pages`` is the last one
                                                 (``last=1``, with the state slot or state
                                                 pages and the aux row);
                                                 a last chunk may have zero pages: then it is
                                                 the one with ``state_indices`` (or
                                                 ``last_chunk=True``)
``sender.poll()`` / ``abort()``                  ``poll`` / ``cancel`` (as on the decode; a
                                                 room the prefill ferryd has not seen is Failed
                                                 at once, and the decode's later prepare of it
                                                 is refused)
===============================================  ================================================

``failure_exception()`` raises :class:`FerryKVTransferError` (a :class:`~ferry.errors.FerryError`
whose ``code`` is ferryd's error code, e.g. 302 ``peer_lost``), as SGLang's ``KVTransferError``
carries ``bootstrap_room``, ``failure_reason`` and ``is_from_another_rank``. ``poll()`` returns
:class:`KVPoll` values (SGLang's numbers: Failed 0 .. Success 4). An error ferryd answers to a
request (``prepare``, ``send``) or a local rule broken by one request fails **that** request only:
its ``poll()`` turns Failed, its ``failure_exception()`` raises the reason and code; other
requests, and the manager, go on.

**state_indices.** SGLang passes, on the last chunk and in ``send_metadata``, one entry per state
component of ``KVArgs.state_types``; Ferry moves one component per rank (one state pool,
``pools.mamba``), of type ``mamba``, ``swa``, ``dsa`` or ``minimax_index_k``
(:meth:`FerryKVArgs.state_component` refuses two or more, the row-indexed ``swa_ring`` and
``c128_state``, and ``dsa`` without MLA, at construction, naming them).

- ``mamba`` (``[[slot]]``): the entry is a list holding exactly one index, which goes on the
  wire as the scalar ``state_slot``. Any other length, or no entry (``None``) while ferryd has
  a state pool, fails the request alone with SGLang's words ``PD state transfer failed: mamba
  requires single state index, got src=N, dst=M``. Each side sees only its own indices: the
  prefill names its count as ``src`` and the decode its count as ``dst``, and the other side's
  count is given as 1, which is what any request that reaches the wire carries (each side
  refuses anything else before it leaves, and ferryd refuses a prepare without exactly one
  slot).
- ``swa``, ``dsa``, ``minimax_index_k`` (``[[page, page, ...]]``, protocol v8): the entry is that
  pool's page list (SGLang's SWA window pages in the SWA pool's numbering; every page of the
  request for ``dsa`` and ``minimax_index_k``), which goes on the wire as ``state_pages``, with
  no slot: the decode's in its ``prepare``, the prefill's in its last ``send``. ``None`` names no
  pages. ferryd refuses a last send whose count differs from the decode's (SGLang truncates;
  Ferry does not): the request fails and its room is cancelled.

A flat ``[slot]`` or ``[page, ...]`` (SGLang's format before the per-component lists) is taken
as the component's entry. Non-last chunks carry no state (their ``state_indices`` are ignored,
as SGLang passes None there).

**decode_prefix_len.** SGLang's decode may already hold a prefix of the prompt (its radix cache);
it allocates and names only the pages of tokens ``[decode_prefix_len, len(prompt))`` and tells
the prefill ``decode_prefix_len``, whose scheduler, on WaitingForInput, calls
``pop_decode_prefix_len()``, sets ``start_send_idx`` to it and computes ``num_pages`` from the
rest before ``sender.init``: the prefix's pages are never sent. In Ferry the decode's ``prepare``
carries exactly that page list (``dst_pages`` = ``page_indices``, the pages after the prefix),
and the prefill's chunks fill it by position, so the only thing the prefill engine must learn is
the number. It travels with the room: :meth:`FerryKVReceiver.send_metadata` puts it in the
prepare (``prefix_tokens``, protocol v4), the decode's ferryd hands it to every prefill rank
with its part of the prepare, and a prefill ferryd answers it in every poll from WaitingForInput
on, which is when SGLang's scheduler calls :meth:`FerryKVSender.pop_decode_prefix_len`. No store
is shared between the engines. (Should a prefill engine send from token 0 anyway, ferryd refuses
the chunk that goes beyond the decode's page list: the request fails, nothing is written out of
place; decode ranks of one room that name different prefixes fail it too.)
``decode_prefix_len`` must be a multiple of the page size (ferryd's ``page_tokens``), as a
radix-cache match on pages is.

**Bootstrap.** SGLang's bootstrap server is :class:`FerryKVBootstrapServer` (``host=``,
``port=``; SGLang's routes): each prefill manager registers its ferryd's control address there,
and a decode manager constructed as SGLang constructs it finds the ranks through it
(:class:`FerryHTTPBootstrap`). Or give the managers a :class:`FerryBootstrap`: a table (or a
callable) of every prefill rank's control address per bootstrap address, or, with
``discover=True``, one seed address per instance and ferryd's ``discover`` for the rest.

**Construction.** ``KVManager(args, disaggregation_mode, server_args, is_mla_backend)``,
``KVSender(mgr, bootstrap_addr, bootstrap_room, dest_tp_ranks, pp_rank,
req_has_disagg_prefill_dp_rank=False)``, ``KVReceiver(mgr, bootstrap_addr, bootstrap_room)``
and ``KVBootstrapServer(host, port)`` take SGLang's arguments; what Ferry needs besides comes
from ``FERRY_*`` environment variables (:class:`FerrySettings`, docs/integration.md).

The adapter's parts: :mod:`ferry.sglang.bootstrap` (:class:`FerryBootstrap`),
:mod:`ferry.sglang.http` (:class:`FerryHTTPBootstrap`), :mod:`ferry.sglang.server`
(:class:`FerryKVBootstrapServer`), :mod:`ferry.sglang.settings` (:class:`FerrySettings`),
:mod:`ferry.sglang.kvargs` (:class:`FerryKVArgs`), :mod:`ferry.sglang.manager`
(:class:`FerryKVManager`), :mod:`ferry.sglang.rooms` (:class:`FerryKVReceiver`,
:class:`FerryKVSender`, :func:`poll_all`), :mod:`ferry.sglang.state` (``state_indices`` as a
slot or state pages) and :mod:`ferry.sglang.types` (:data:`KVPoll`, the
failure texts, :class:`FerryKVTransferError`); import them from here.
"""

from __future__ import annotations

from typing import Optional

from . import bootstrap
from .bootstrap import FerryBootstrap
from .http import FerryHTTPBootstrap
from .kvargs import MAMBA, FerryKVArgs
from .manager import FerryKVManager
from .host_memory import host_buffer, host_regions
from .rooms import FerryKVReceiver, FerryKVSender, poll_all
from .server import FerryKVBootstrapServer, FerryPrefillInfo
from .settings import FerrySettings
from .types import (ABORTED, FROM_ANOTHER_RANK, FerryKVTransferError,
                           FerryTransferMetric, KVPoll)

PrefillRanks = bootstrap.PrefillRanks
"""The type of :class:`FerryBootstrap`'s ``prefill_ranks``: a table or a callable."""

# SGLang's names, for a backend table entry (``KVClassType.KVARGS``, ``MANAGER``, ``SENDER``,
# ``RECEIVER``, ``BOOTSTRAP_SERVER``): each is constructed exactly as SGLang constructs its own.
KVArgs = FerryKVArgs
KVManager = FerryKVManager
KVSender = FerryKVSender
KVReceiver = FerryKVReceiver
KVBootstrapServer = FerryKVBootstrapServer
KVTransferError = FerryKVTransferError
KVTransferMetric = FerryTransferMetric
PrefillServerInfo = FerryPrefillInfo


class FerryBackendProvider:
    """SGLang's dynamic disaggregation backend provider: with
    ``--disaggregation-transfer-backend dynamic`` and
    ``--disaggregation-transfer-backend-extra-config '{"backend_name": "ferry", "module_path":
    "ferry.sglang", "class_name": "FerryBackendProvider"}'`` SGLang imports this module,
    constructs this class with no argument and asks :meth:`get_kv_class` for each class it
    builds, so no SGLang patch is needed (docs/integration.md §9)."""

    CLASSES = {"KVARGS": KVArgs, "MANAGER": KVManager, "SENDER": KVSender,
               "RECEIVER": KVReceiver, "BOOTSTRAP_SERVER": KVBootstrapServer}

    def get_kv_class(self, class_type: object) -> Optional[type]:
        """The class for SGLang's ``KVClassType`` member (or its name or value, any case);
        None for a kind Ferry does not provide, as SGLang's providers answer."""
        for key in (getattr(class_type, "name", None), getattr(class_type, "value", None),
                    class_type):
            if isinstance(key, str) and key.upper() in self.CLASSES:
                return self.CLASSES[key.upper()]
        return None

__all__ = ["KVPoll", "MAMBA", "ABORTED", "FROM_ANOTHER_RANK", "FerryKVTransferError",
           "FerryBootstrap", "FerryHTTPBootstrap", "FerryKVArgs", "FerryKVManager",
           "FerryKVReceiver", "FerryKVSender", "FerryKVBootstrapServer", "FerryPrefillInfo",
           "FerrySettings", "FerryTransferMetric", "poll_all", "KVArgs", "KVManager",
           "KVSender", "KVReceiver", "KVBootstrapServer", "KVTransferError",
           "KVTransferMetric", "PrefillServerInfo", "FerryBackendProvider",
           "host_buffer", "host_regions"]
