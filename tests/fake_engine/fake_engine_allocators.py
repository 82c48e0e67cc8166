"""The fake engine's allocators (tests/fake_engine/fake_engine.py): each engine hands out its own pages,
state slots and aux rows as an inference engine would, reuses an aborted request's memory
first (so a later request proves it clean), and ends full again, which the run checks.
"""

from __future__ import annotations

from collections import deque
from typing import Optional

from fake_engine_schedule import runs


class PageAllocator:
    """Free pages as sorted extents; allocation takes the preferred pages first (those of an
    aborted request, so a later request reuses them), then the lowest free ones."""

    def __init__(self, n: int, first: int = 0) -> None:
        self.n, self.first = n, first  # pages first..first+n-1 (SGLang keeps page 0 as padding)
        self.ext: list[list[int]] = [[first, n]]  # [start, length], sorted, merged
        self.free_count = n

    def alloc(self, n: int, prefer: Optional[set[int]] = None) -> Optional[list[int]]:
        if n > self.free_count:
            return None
        got: list[int] = []
        if prefer:
            for p in sorted(prefer):
                if len(got) == n:
                    break
                if self._take(p):
                    got.append(p)
        i = 0
        while len(got) < n:
            start, length = self.ext[i]
            k = min(length, n - len(got))
            got.extend(range(start, start + k))
            if k == length:
                self.ext.pop(i)
            else:
                self.ext[i] = [start + k, length - k]
        self.free_count -= n
        return got

    def _take(self, p: int) -> bool:
        for i, (s, l) in enumerate(self.ext):
            if s <= p < s + l:
                parts = [[s, p - s], [p + 1, s + l - p - 1]]
                self.ext[i:i + 1] = [x for x in parts if x[1] > 0]
                return True
            if s > p:
                return False
        return False

    def free(self, pages: list[int]) -> None:
        for _, first, n in runs(sorted(pages)):
            self.ext.append([first, n])
        self.free_count += len(pages)
        self.ext.sort()
        merged: list[list[int]] = []
        for s, l in self.ext:
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1][1] += l
            elif merged and merged[-1][0] + merged[-1][1] > s:
                raise AssertionError(f"page {s} freed twice")
            else:
                merged.append([s, l])
        self.ext = merged

    @property
    def full(self) -> bool:
        return self.free_count == self.n and self.ext == [[self.first, self.n]]


class IndexAllocator:
    """State slots or aux rows; a freed index of an aborted request is handed out first."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.free_list = deque(range(n))

    def alloc(self) -> Optional[int]:
        return self.free_list.popleft() if self.free_list else None

    def free(self, i: int, first: bool = False) -> None:
        if i in self.free_list:
            raise AssertionError(f"index {i} freed twice")
        (self.free_list.appendleft if first else self.free_list.append)(i)

    @property
    def full(self) -> bool:
        return sorted(self.free_list) == list(range(self.n))
