"""`python -m nas`: the Hydra entry point (see `nas.cli`)."""

from nas.cli import main

main()
