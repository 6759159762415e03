"""Pretrain on a wall-clock budget: `python pretrain.py arch=crammed-bert data=python-docs budget=24`."""

import hydra
from hydra.core.hydra_config import HydraConfig

from cramming.config import load_config
from cramming.errors import exit_on_user_error
from cramming.pretraining import pretrain


@hydra.main(version_base="1.3", config_path="conf", config_name="pretrain")
@exit_on_user_error
def main(cfg) -> float:
    config = load_config(cfg)  # every value checked before any work
    summary = pretrain(config, HydraConfig.get().runtime.output_dir)
    return summary.get("val_loss", 0.0)  # the objective a sweeper minimises


if __name__ == "__main__":
    main()
