"""The NAS harness: Optuna proposes architectures from `search_spaces`, the pipeline
runtime trains them (`nas.study`), the best are retrained and exported (`nas.retrain`), and
`load_model` brings an exported model back as a plain `torch.nn.Module`.

Entry points: `python -m nas` (Hydra, `nas.cli`), `nas.study.run.run_study(settings)`,
`nas.retrain.stage.retrain(settings)`, `nas.load_model(path)` (or `from_pretrained` on the model
classes of `nas.export.pretrained`).

Where a new part goes: a task subclasses `nas.tasks.Task` (`nas/tasks/base.py`), a tracker
`nas.tracking.Tracker` (`nas/tracking/base.py`), a sampler `optuna.samplers.BaseSampler`, a
pruner `optuna.pruners.BasePruner`, a search space `search_spaces.SearchSpace`; each is
named by import path in the config (`task.name=my_pkg.tasks:MyTask`) or registered in its
kind's `pipeline.pure.registry.Registry` (`TASKS`, `TRACKERS`, `SAMPLERS`, `PRUNERS`,
`search_spaces.SPACES`).

`load_model` is imported on first use (module `__getattr__`), so `import nas` costs nothing
and loading a model imports only the core install (`nas.export.pretrained`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nas.export.pretrained import load_model

__all__ = ["load_model"]


def __getattr__(name: str) -> Any:
    if name == "load_model":
        from nas.export.pretrained import load_model

        return load_model
    raise AttributeError(f"module 'nas' has no attribute {name!r}")
