"""The SGLang adapter's reading of one request's indices (see :mod:`ferry.sglang`): SGLang's
``state_indices`` as Ferry's ``state_slot`` (a Mamba component) or ``state_pages`` (a
page-indexed component: swa, dsa, minimax_index_k), and ``aux_index`` as a row, with the
request's failure (:class:`_RequestFailed`) when they do not fit.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import Errc
from ..protocol import StateType


class _RequestFailed(Exception):
    """One request's failure found locally: its code and reason."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass
class StateIndices:
    """How one rank reads ``state_indices``: whether its ferryd has a state pool
    (``has_state``), which ``state_types`` entry is the state component (``component``, of
    ``n_types``) and its type."""

    has_state: bool
    component: Optional[int]
    n_types: int
    state_type: Optional[StateType]

    def state_of(self, state_indices: Any, side: str) -> tuple[Optional[int], list[int]]:
        """``(state_slot, state_pages)``: a Mamba component gives its one slot
        (:meth:`state_slot`), a page-indexed one its page list (:meth:`state_pages`); without
        a state pool, neither."""
        if self.state_type is not None and self.state_type.paged:
            return None, self.state_pages(state_indices, side)
        return self.state_slot(state_indices, side), []

    def state_slot(self, state_indices: Any, side: str) -> Optional[int]:
        """The scalar slot of ``state_indices``, or None without a state pool. Raises
        :class:`_RequestFailed` with SGLang's text when the Mamba entry does not hold exactly
        one index (each side names its own count, the other's as 1)."""
        if not self._state_pool(state_indices):
            return None
        entry = _component_entry(state_indices, self.component, self.n_types)
        n = 0 if entry is None else len(entry)
        if n != 1:
            src, dst = (n, 1) if side == "src" else (1, n)
            raise _RequestFailed(Errc.INVALID_REQUEST,
                                 f"PD state transfer failed: mamba requires single state index, "
                                 f"got src={src}, dst={dst}")
        assert entry is not None
        slot = _as_index(entry[0])
        if slot is None or slot < 0:
            raise _RequestFailed(Errc.INVALID_REQUEST,
                                 f"PD state transfer failed: state index {entry[0]!r} is not a "
                                 f"slot number")
        return slot

    def state_pages(self, state_indices: Any, side: str) -> list[int]:
        """The page list of a page-indexed component's entry of ``state_indices`` (pages of
        that component's pool: an SWA window's, or every page of the request for dsa and
        minimax_index_k), in order; [] for no entry (``None``: SGLang moves nothing of the
        component then). ferryd checks each page against its pool, and the prefill's count
        against the decode's: it refuses a last send whose count differs (Ferry does not
        truncate)."""
        if not self._state_pool(state_indices):
            return []
        entry = _component_entry(state_indices, self.component, self.n_types)
        pages = []
        for v in entry or []:
            page = _as_index(v)
            if page is None or page < 0:
                name = self.state_type.wire_name if self.state_type is not None else "state"
                raise _RequestFailed(Errc.INVALID_REQUEST,
                                     f"PD state transfer failed: {side} {name} state index "
                                     f"{v!r} is not a page number")
            pages.append(page)
        return pages

    def _state_pool(self, state_indices: Any) -> bool:
        """Whether this rank moves state; state indices without a state pool fail the
        request."""
        if self.has_state:
            return True
        if _entries(state_indices):
            raise _RequestFailed(Errc.INVALID_REQUEST,
                                 "state_indices were given, but this ferryd has no state "
                                 "pool (pools.mamba)")
        return False


def _as_index(v: Any) -> Optional[int]:
    try:
        return operator.index(v)
    except TypeError:
        pass
    try:  # a one-element array
        f = float(v)
        return int(f) if f.is_integer() else None
    except (TypeError, ValueError):
        return None


def _is_sequence(v: Any) -> bool:
    if isinstance(v, (str, bytes)):
        return False
    try:
        len(v)
        return True
    except TypeError:  # ints, numpy 0-d arrays
        return False


def _entries(state_indices: Any) -> int:
    """How many state indices a request names at all (any component)."""
    if state_indices is None:
        return 0
    items = list(state_indices)
    if items and all(_is_sequence(x) or x is None for x in items):
        return sum(len(x) for x in items if x is not None)
    return len(items)


def _component_entry(state_indices: Any, component: Optional[int], n_types: int
                     ) -> Optional[list[Any]]:
    """The state component's indices: ``state_indices[component]`` of the per-component form,
    or the flat list itself."""
    if state_indices is None:
        return None
    items = list(state_indices)
    if not items:
        return []
    if all(_is_sequence(x) or x is None for x in items):  # one entry per component
        if n_types and len(items) != n_types:
            raise _RequestFailed(Errc.INVALID_REQUEST,
                                 f"PD state transfer failed: state_indices has {len(items)} "
                                 f"components, the KVArgs' state_types {n_types}")
        entry = items[component if component is not None else 0]
        return None if entry is None else list(entry)
    return items  # the flat format: the component's indices themselves


__all__ = ["StateIndices"]
