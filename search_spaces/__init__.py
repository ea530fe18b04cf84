"""Architectures as data and the torch modules they build: the Evolved Transformer space.

    from search_spaces.compile import compile
    from search_spaces.evolved_transformer import sample
    from search_spaces.architecture import summary
    from search_spaces.suggest import RandomSuggest

    arch = sample(RandomSuggest(0), d_model=128)     # or an optuna.Trial: define-by-run
    print(summary(arch))
    specs = compile(arch, vocab_size, max_len=64, dropout=0.1)  # list[pipeline.LayerSpec]

Modules: `suggest` (the Suggest protocol and two stand-ins for a trial), `layers` (one torch
module per layer type), `architecture` (the frozen dataclasses, JSON, summary), `cells`
(a cell as a module), `compile` (LayerSpecs and the carry convention), `evolved_transformer`
(sampling, validity, Primer's optional primitives as choices), `seeds` (the Transformer and
Evolved Transformer seeds), `primer` (Primer's primitives applied to an architecture, to
measure them). Nothing is re-exported
here: `compile` and `evolved_transformer` are both module and function names, and a
re-export would shadow the module. Imports only the standard library, torch, numpy and
`pipeline`.
"""
