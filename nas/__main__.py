"""`python -m nas`: the command (`nas.entry`: the stage processes' server, then `nas.cli`)."""

from nas.entry import main

main()
