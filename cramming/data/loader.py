"""Batches of packed sequences for training (endless, in the configured order) and validation (fixed)."""

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from ..errors import UserError
from .packed import PackedTokens


def open_split(folder: Path, meta: dict, split: str) -> PackedTokens:
    return PackedTokens(folder / f"{split}.bin", np.dtype(meta["dtype"]), meta["seq_length"], meta["special_ids"]["cls"])


def epoch_order(folder: Path, num_sequences: int, ordering: str, seed: int, epoch: int) -> np.ndarray:
    """random: a fresh permutation per epoch. sentence-length: Cramming's curriculum, sequences sorted by their
    count of "." tokens (fewer, i.e. longer sentences, first), ties in random order."""
    perm = np.random.default_rng([seed, epoch]).permutation(num_sequences)
    if ordering == "random":
        return perm
    periods = np.load(folder / "train_periods.npy")
    return perm[np.argsort(periods[perm], kind="stable")]


class EndlessOrder(Sampler):
    """Epoch after epoch of the configured order, starting `start` sequences into the stream (a resumed run
    continues exactly where it stopped, without replaying or skipping a sequence). With `block` > 1 the order is
    over blocks of that many consecutive rows, kept together (the sequence-length curriculum joins them)."""

    def __init__(self, folder: Path, num_sequences: int, ordering: str, seed: int, start: int = 0, block: int = 1):
        self.folder, self.ordering, self.seed, self.start, self.block = folder, ordering, seed, start, block
        self.blocks = num_sequences // block

    def __iter__(self):
        epoch, offset = divmod(self.start, self.blocks * self.block)
        while True:
            order = epoch_order(self.folder, self.blocks, self.ordering, self.seed, epoch)
            if self.block > 1:
                order = (order[:, None] * self.block + np.arange(self.block)).reshape(-1)
            yield from order[offset:].tolist()
            epoch, offset = epoch + 1, 0


def train_batches(folder: Path, meta: dict, ordering: str, seed: int, microbatch_size: int, num_workers: int,
                  pin_memory: bool, start: int = 0, block: int = 1, world: int = 1):
    """`microbatch_size`: the global microbatch, impl.microbatch_size on each of `world` processes."""
    data = open_split(folder, meta, "train")
    if len(data) < max(microbatch_size, block):
        share = f" x {world} processes" if world > 1 else ""
        raise UserError(f"only {len(data)} training sequences, fewer than one microbatch "
                        f"(impl.microbatch_size={microbatch_size // world}{share}); give more text or lower the "
                        "microbatch")
    loader = DataLoader(
        data,
        batch_size=microbatch_size,
        sampler=EndlessOrder(folder, len(data), ordering, seed, start, block),
        drop_last=True,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
    )
    return iter(loader)


def validation_batches(folder: Path, meta: dict, max_sequences: int, batch_size: int):
    data = open_split(folder, meta, "val")
    count = min(len(data), max_sequences)
    for start in range(0, count, batch_size):
        yield torch.from_numpy(data.rows(range(start, min(count, start + batch_size))))
