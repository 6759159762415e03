"""The sections of scripts/bench.py, one module each; common.py holds what they share."""
