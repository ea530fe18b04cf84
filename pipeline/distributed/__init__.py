"""The distributed parts of the runtime: processes and messages, and the facade over them.

`ElasticPipeline` (elastic.py) is the public facade, one per rank. It composes parts that
each own their state and change only through their methods, and delegates its longer
methods to helper modules, each typed against a narrow interface in `parts` that lists what
it reads (so none imports the facade, and only the facade replaces its own parts):

    ElasticPipeline ── the public API: train_step, train, forward, repartition, rebalance,
     │                 reconfigure, snapshot, stats, full_state_dict ... (read-only views
     │                 of the model: `views.ModelViews`)
     ├─ comm: Comm                 every collective and point-to-point message (comm.py)
     ├─ options: PipelineOptions   the knobs, checked: PlanOptions, ElasticOptions (options.py)
     ├─ recipe: TrainingRecipe     seed, optimizer factory, loss (pipeline.local.recipe)
     ├─ placement: Placement       which rank holds which stage (pipeline.pure.placement)
     ├─ model: ModelHolder         specs, sizes, plan, handoff cut, step counters (holder.py)
     │   └─ Stage (one per stage this rank holds)   layers + optimizer (pipeline.local.stage)
     │       ├─ layers: StageLayer       module, memory action, meter (pipeline.local.layer)
     │       ├─ memory: MemoryPolicy     keep / recompute / swap, saved bytes (stage_memory)
     │       └─ cost meters, backward walk                  (stage_costs, stage_backward)
     ├─ runner: StepRunner         links to stages on other ranks + this rank's action list;
     │   ├─ PeerLink               one per edge that crosses ranks: the activation /
     │   │                         gradient wire protocol (links.py)
     │   └─ executor.Run           one list for all the rank's stages, same-rank hand-overs
     │                             in memory (executor.py); failures agreed at the flush
     │                             (flushed_step.py)
     ├─ plan_age: PlanAge, triggers: ReplanTriggers    when to re-plan (triggers.py)
     ├─ event_log: EventLog        builds, migrations, re-plans, errors (events.py)
     └─ planner, cost_cache        (pipeline.pure.planner, pipeline.local.profiler)

    helper modules (called by the facade, in every rank, in the same order):
      build       plan (agreement: profile, plan on rank 0) and build a model; Bi-Partition's
                  cut (handoff)
      steps       a flushed train_step and forward            ──> runner
      stream      2BW / PipeMare `train` without flushes      ──> runner
      elasticity  repartition, rebalance, reconfigure         ──> migration (transfer), build
      weights     full state dict, snapshots, inheritance     ──> inheritance
      report      stats and pictures

`launch` starts the stage processes for one run of a function (or joins torchrun's group);
`pool.StagePool` keeps them for many pipelines of any size, lending each job its processes
(`pool_member`: one process's side; `pool_jobs`: a job's reports; `pipeline.pure.pool`: who
gets which process); both start and end processes as `processes` says.
"""
