"""A retrained model as a Hugging Face-style folder: written, described, loaded.

Owned here, above the settings and the tasks whose values a folder records:

    folder       the files of a folder and reading them back (`config.json`, weights)
    card         the model card (`README.md`): its facts rendered as Markdown
    pictures     the architecture drawn for the card (matplotlib)
    pretrained   the loadable models (`ExportedModel`, `TranslationModel`, `load_model`):
                 the core install alone, no Optuna, Hydra or W&B
    writing      `export_model` and `write_model_card`: the retrain stage's hand-over

`pretrained` and `folder` import only `nas.text` of the harness, so that `nas.load_model`
works in a process that has nothing else.
"""

from nas.export.pretrained import ExportedModel, ModelFolderError, TranslationModel, load_model
from nas.export.writing import export_model, write_model_card

__all__ = [
    "ExportedModel",
    "ModelFolderError",
    "TranslationModel",
    "export_model",
    "load_model",
    "write_model_card",
]
