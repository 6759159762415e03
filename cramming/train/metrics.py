"""Per-step metrics: one JSON object per line in metrics.jsonl, flushed each line so a crash loses nothing."""

import json
from pathlib import Path


class MetricsLog:
    def __init__(self, run_dir: Path, tensorboard: bool = False):
        self.file = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # needs the optional `tensorboard` package

            self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.writer is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "step":
                    self.writer.add_scalar(key, value, record.get("step", 0))

    def close(self) -> None:
        self.file.close()
        if self.writer is not None:
            self.writer.close()
