"""The NAS harness: Optuna proposes architectures from `search_spaces`, the pipeline
runtime trains them (`nas.study`), the best are retrained and exported (`nas.retrain`), and
`load_model` brings an exported model back as a plain `torch.nn.Module`.

Entry points: `python -m nas` (Hydra, `nas.cli`), `nas.study.run_study(settings)`,
`nas.retrain.retrain(settings)`, `nas.load_model(path)`.
"""

from nas.export import load_model

__all__ = ["load_model"]
