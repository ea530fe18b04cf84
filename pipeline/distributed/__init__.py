"""The distributed parts of the runtime: processes and messages.

`launch` starts the stage processes; `comm.Comm` is the one owner of every collective and
point-to-point message; `links` is the activation/gradient wire protocol between
neighbours, `executor` runs a stage's action list over it, and `runner.StepRunner` owns
both for the facade; `transfer` and `migration` move layers live; `agreement` gets costs
and plans onto every rank; `triggers` decides when to re-plan; `elastic.ElasticPipeline` is
the facade users hold; `report` gathers its figures into typed `PipelineStats`, and
`events` types its log.
"""
