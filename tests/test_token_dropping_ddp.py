"""Token dropping's importance buffer under torch.distributed: every rank's per-token losses go into it. Two gloo
processes, each updating from its half of a global microbatch, end with the buffer one process gets from the
whole microbatch, and with the same buffer as each other (no rank-0 broadcast needed to make them agree)."""

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cramming.model.configuration_crammed import CrammedConfig
from cramming.model.token_dropping import TokenImportance

VOCAB = 64


def importance() -> TokenImportance:
    return TokenImportance(CrammedConfig(vocab_size=VOCAB, num_layers=4, hidden_size=32, num_heads=2, ffn_size=64,
                                         token_dropping={"keep": 0.5, "decay": 0.9}))


def microbatches():
    """Three global microbatches of 16 predicted tokens: ids drawn from a few so the ranks share some; one NaN."""
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(5, 20, (16,), generator=g), torch.rand(16, generator=g) * 8) for _ in range(3)]
    batches[1][1][3] = float("nan")
    batches[2][0][:4] = -100
    return batches


def rank_updates(rank: int, world: int, init: str, out: str) -> None:
    """One rank: updates from its slice of each global microbatch (as the engines read them), then saves."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        imp = importance()
        for targets, losses in microbatches():
            rows = slice(rank * 16 // world, (rank + 1) * 16 // world)
            imp.update(targets[rows], losses[rows])
        torch.save(imp.loss, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_two_ranks_update_as_one_process_over_the_whole_batch(tmp_path):
    mp.spawn(rank_updates, args=(2, f"file://{tmp_path / 'store'}", str(tmp_path / "loss")), nprocs=2)
    ranks = [torch.load(tmp_path / f"loss.{r}") for r in range(2)]
    one = importance()
    for targets, losses in microbatches():
        one.update(targets, losses)
    assert torch.equal(ranks[0], ranks[1])  # the ranks agree by themselves
    torch.testing.assert_close(ranks[0], one.loss)  # and hold the whole global microbatch's averages
    alone = importance()
    for targets, losses in microbatches():
        alone.update(targets[:8], losses[:8])
    assert not torch.allclose(ranks[0], alone.loss)  # which rank 0's slice alone does not give


def test_the_update_all_reduces_sums_and_counts(monkeypatch):
    """In process, two threads as two ranks and a summing all-reduce: the same agreement, quickly (the gloo test
    above is in the slow tier)."""
    import threading

    from cramming.model import token_dropping

    meeting, box = threading.Barrier(2), []

    def all_reduce(tensor):
        box.append(tensor.clone())
        meeting.wait()
        tensor.copy_(box[0] + box[1])
        meeting.wait()
        if threading.current_thread().name == "rank0":
            box.clear()
        meeting.wait()

    monkeypatch.setattr(token_dropping.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(token_dropping.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(token_dropping.dist, "all_reduce", all_reduce)
    ranks = [importance(), importance()]

    def rank(r):
        for targets, losses in microbatches():
            ranks[r].update(targets[r * 8:(r + 1) * 8], losses[r * 8:(r + 1) * 8])

    threads = [threading.Thread(target=rank, args=(r,), name=f"rank{r}") for r in range(2)]
    [t.start() for t in threads], [t.join() for t in threads]
    one = importance()
    monkeypatch.setattr(token_dropping.dist, "is_initialized", lambda: False)
    for targets, losses in microbatches():
        one.update(targets, losses)
    assert torch.equal(ranks[0].loss, ranks[1].loss)
    torch.testing.assert_close(ranks[0].loss, one.loss)
