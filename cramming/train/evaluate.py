"""Validation MLM loss and accuracy on the held-out split, with the same masks every time it is measured."""

import torch

from ..data.loader import validation_batches
from .masking import mask_tokens


@torch.inference_mode()
def validation_metrics(model, folder, meta, cfg_train, batch_size: int, device, autocast) -> dict:
    was_training = model.training
    model.eval()
    generator = torch.Generator(device=device).manual_seed(1234)  # identical masks for before / after
    special = torch.tensor(list(meta["special_ids"].values()), device=device)
    total_loss, correct, count = 0.0, 0, 0
    for batch in validation_batches(folder, meta, cfg_train.validation_sequences, batch_size):
        batch = batch.to(device)
        inputs, labels = mask_tokens(batch, cfg_train.mask_prob, meta["special_ids"]["mask"], meta["vocab_size"],
                                     special, cfg_train.mask_token_share, generator)
        with autocast():
            out = model(input_ids=inputs, labels=labels)
        selected = labels != -100
        targets = labels[selected]
        # The sparse head already returns only the masked rows; a dense head returns every position.
        logits = out.logits[selected] if out.logits.dim() == 3 else out.logits
        total_loss += out.loss.float().item() * targets.numel()
        correct += (logits.argmax(-1) == targets).sum().item()
        count += targets.numel()
    model.train(was_training)
    return {"val_loss": total_loss / count, "val_accuracy": correct / count, "val_masked_tokens": count}
