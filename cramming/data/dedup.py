"""Exact document deduplication in bounded, compact memory.

Documents are streamed, so the only state that grows with the corpus is the set of hashes already seen.
A Python set of digests costs ~80 bytes per document; this open-addressing table keeps 8 bytes of each
document's 16-byte digest in one numpy array of 8-byte slots, kept at most half full: 16 bytes per document just
before the table doubles, 32 right after (and while it doubles, the old keys are copied out once more). So 100 M
documents take a 2^28-slot table, 2.1 GB, and a 10 MB corpus (tens of thousands of documents) well under 2 MB.
(A 64-bit collision between two different documents is about as likely as 1 in 3,000 at 100 M documents.)
"""

import numpy as np


class SeenHashes:
    def __init__(self, capacity: int = 1 << 16):
        self.table = np.zeros(capacity, dtype=np.uint64)  # 0 marks an empty slot
        self.count = 0

    def add(self, digest: bytes) -> bool:
        """Record a document hash; True if it was new, False if this document was seen before."""
        key = int.from_bytes(digest[-8:], "little") or 1
        if self._insert(self.table, key):
            self.count += 1
            if self.count * 2 > len(self.table):
                self._grow()
            return True
        return False

    @staticmethod
    def _insert(table: np.ndarray, key: int) -> bool:
        mask = len(table) - 1
        slot = key & mask
        while True:
            current = int(table[slot])
            if current == 0:
                table[slot] = key
                return True
            if current == key:
                return False
            slot = (slot + 1) & mask

    def _grow(self) -> None:
        old = self.table[self.table != 0]
        self.table = np.zeros(2 * len(self.table), dtype=np.uint64)
        for key in old.tolist():
            self._insert(self.table, key)
