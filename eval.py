"""Fine-tune a checkpoint on GLUE (or your own task): `python eval.py checkpoint=<folder>` or `name=<run>`."""

import hydra
from hydra.core.hydra_config import HydraConfig

from cramming.errors import exit_on_user_error
from cramming.eval.config import load_eval_config
from cramming.evaluation import evaluate


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
@exit_on_user_error
def main(cfg) -> None:
    config = load_eval_config(cfg)  # every value checked before any work
    evaluate(config, HydraConfig.get().runtime.output_dir)


if __name__ == "__main__":
    main()
