"""`python -m nas` / `elastic-nas`: one Hydra run is one NAS study (`--multirun` sweeps).

Hydra composes `conf/` (see `nas.config`), changes nothing else: the run folder is Hydra's
output directory, the study storage sits at a stable path under `outputs/studies/` so a
re-run with the same `study.name` resumes, and the study itself is the plain function
`nas.study.run_study(settings)`. At the end the results are summarised (`nas.report`).

    python -m nas study.name=demo study.n_trials=4 train.steps=40 sampler=evolution
    python -m nas --multirun pipeline.schedule=1f1b,gpipe seed=0,1
"""

from __future__ import annotations

import os

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from nas.config import CONFIG_DIR, register, to_settings

register()


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    os.environ.setdefault("WANDB_MODE", "offline")
    OmegaConf.update(cfg, "output_dir", HydraConfig.get().runtime.output_dir, force_add=True)
    settings = to_settings(cfg)
    from nas.report import report_study  # after composing: --help and --cfg stay fast
    from nas.study import run_study

    result = run_study(settings)
    if os.environ.get("RANK", "0") == "0":  # under torchrun: rank 0 reports
        report_study(settings, result)


if __name__ == "__main__":
    main()
