"""The Hydra configuration, shipped as the package `nas.conf` (pyproject.toml maps it here).

Hydra reads it as `pkg://nas.conf`, which finds it in an installed wheel and in an editable
install alike; the folder itself stays at the top of the repository. Only YAML lives here.
"""
