"""MLM masking with a fixed number of masked positions per sequence.

A fixed count keeps every tensor shape static (the sparse prediction head sees exactly
batch * count rows each step), which is what lets torch.compile and CUDA graphs specialise once.
"""

import torch


def mask_tokens(
    input_ids: torch.Tensor,
    mask_prob: float,
    mask_token_id: int,
    vocab_size: int,
    special_ids: torch.Tensor,
    mask_token_share: float = 0.8,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (inputs, labels): `round(mask_prob * seq_len)` positions per row get labels; of those,
    `mask_token_share` become [MASK], the rest split evenly into a random token and the unchanged token.
    Special tokens ([CLS], [SEP], [PAD]) are never chosen while enough ordinary tokens remain."""
    batch, seq_len = input_ids.shape
    count = max(1, round(mask_prob * seq_len))
    device = input_ids.device
    scores = torch.rand(batch, seq_len, generator=generator, device=device)
    scores = scores.masked_fill(torch.isin(input_ids, special_ids), -1.0)
    positions = scores.topk(count, dim=1).indices

    labels = torch.full_like(input_ids, -100)
    labels.scatter_(1, positions, input_ids.gather(1, positions))

    inputs = input_ids.clone()
    choice = torch.rand(batch, count, generator=generator, device=device)
    replace_with_mask = choice < mask_token_share
    replace_with_random = (choice >= mask_token_share) & (choice < mask_token_share + (1 - mask_token_share) / 2)
    random_tokens = torch.randint(vocab_size, (batch, count), generator=generator, device=device)
    chosen = inputs.gather(1, positions)
    chosen = torch.where(replace_with_mask, torch.full_like(chosen, mask_token_id), chosen)
    chosen = torch.where(replace_with_random, random_tokens, chosen)
    inputs.scatter_(1, positions, chosen)
    return inputs, labels


# A mask's generator seed is seed * 2**40 + position: each run seed owns 2**40 (about 10**12) stream positions, far
# more than any run reaches, so two seeds never share a mask; seeds up to 2**24 keep it within torch's 64 bits.
POSITION_BITS = 40


class PositionalMasks:
    """Mask draws as a function of (seed, position in the training stream), not of a generator's history: a
    resumed run, and every rank of a distributed one, draw exactly the masks one uninterrupted process would,
    and there is no generator state to save."""

    def __init__(self, seed: int, device):
        self.seed = seed
        self.generator = torch.Generator(device=device)

    def at(self, position: int) -> torch.Generator:
        return self.generator.manual_seed((self.seed << POSITION_BITS) + position)
