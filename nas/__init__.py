"""The NAS harness: Optuna proposes architectures from `search_spaces`, the pipeline
runtime trains them (`nas.study`), the best are retrained and exported (`nas.retrain`), and
`load_model` brings an exported model back as a plain `torch.nn.Module`.

Entry points: `python -m nas` (Hydra, `nas.cli`), `nas.study.run_study(settings)`,
`nas.retrain.retrain(settings)`, `nas.load_model(path)`.

Where a new part goes: a task subclasses `nas.tasks.Task` (`nas/tasks/base.py`), a tracker
`nas.tracking.Tracker` (`nas/tracking/base.py`), a sampler `optuna.samplers.BaseSampler`;
each is named by import path in the config (`task.name=`, `tracker.name=`, `sampler.name=`,
`nas.plugins`) or added to its group's registry (`TASKS`, `TRACKERS`, `SAMPLERS`).
"""

from nas.export import load_model

__all__ = ["load_model"]
