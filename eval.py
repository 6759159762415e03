"""Fine-tune a checkpoint on GLUE (or your own task): `python eval.py checkpoint=<folder>` or `name=<run>`."""

import sys

try:
    import hydra
    from hydra.core.hydra_config import HydraConfig

    from cramming.cli import check_no_missing, run_entry
    from cramming.errors import exit_on_user_error
    from cramming.eval.config import load_eval_config
    from cramming.eval.recipe import evaluate
except ModuleNotFoundError as missing:  # not the project's environment: say how to get it, in one line
    print(f"error: {missing.name} is not installed for {sys.executable}; run `bash scripts/setup.sh`, then "
          "`source .venv/bin/activate`", file=sys.stderr)
    sys.exit(2)


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
@exit_on_user_error
def main(cfg) -> None:
    check_no_missing(cfg)  # `key=???`
    config = load_eval_config(cfg)  # every value checked before any work
    evaluate(config, HydraConfig.get().runtime.output_dir)


if __name__ == "__main__":
    run_entry(main, "eval.py")  # Hydra's own errors (unknown option, key, bad override): one line, exit 2
