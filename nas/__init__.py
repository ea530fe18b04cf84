"""The NAS harness (Optuna, Hydra, W&B). Built in later issues."""
