"""Hydra configs, shipped inside the package as cramming.conf (pyproject.toml maps it here)."""
