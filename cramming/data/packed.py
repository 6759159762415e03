"""A flat token stream on disk, read as fixed-length [CLS]-prefixed sequences through a memory map."""

from pathlib import Path

import numpy as np


class PackedTokens:
    def __init__(self, path: Path, dtype, seq_length: int, cls_id: int):
        self.path, self.dtype = Path(path), np.dtype(dtype)
        self.stream = np.memmap(path, dtype=dtype, mode="r")
        self.stride = seq_length - 1
        self.cls_id = cls_id

    def __len__(self) -> int:
        return len(self.stream) // self.stride

    def __getitem__(self, index: int) -> np.ndarray:
        row = np.empty(self.stride + 1, dtype=np.int64)
        row[0] = self.cls_id
        row[1:] = self.stream[index * self.stride : (index + 1) * self.stride]
        return row

    def rows(self, indices) -> np.ndarray:
        return np.stack([self[int(i)] for i in indices])

    def count_per_sequence(self, token_id: int, block: int = 1 << 13) -> np.ndarray:
        """How often `token_id` occurs in each sequence (for the sentence-length curriculum). Read in blocks with
        plain file reads, not through the memory map: mapped pages stay resident, so memory would grow with the
        corpus."""
        counts = np.empty(len(self), dtype=np.int32)
        with open(self.path, "rb") as fh:
            for start in range(0, len(self), block):
                stop = min(len(self), start + block)
                chunk = np.fromfile(fh, dtype=self.dtype, count=(stop - start) * self.stride)
                counts[start:stop] = (chunk.reshape(stop - start, self.stride) == token_id).sum(axis=1)
        return counts
