"""The single-process parts of the runtime: torch, but never `torch.distributed`.

Layers as data (`spec`, `determinism`), carries (`carry`), one stage's layers and their
forward / backward compute (`stage`), what they cost (`meter`, `profiler`), micro-batches
(`microbatch`), the single-process reference trainer (`reference`) and ready-made layer
stacks (`models`).
"""
