"""The pure parts of the runtime: no process, no `torch.distributed`, no module state.

Schedules (`schedule`; with several stages per rank: `placement`, `interleaved`, ZB-V in
`zero_bubble`, their checks and lowering in `multi_stage`), the wire rules they obey
(`wire_order`), the simulator that replays them on layer costs (`simulate`), the cost
model (`costs`), stage sizes (`partition`), pictures (`timeline`) and the planners
(`planner`). Everything here is a function of its arguments, tested without processes.

Where a new part goes: a schedule is a `schedule_spec.ScheduleSpec` added with
`schedule.register_schedule`; a planner subclasses `planner.base.Planner` (its lifecycle
is stated there) and joins `planner.PLANNERS`, or is passed as an instance. Every kind of
part found by name is kept in a `registry.Registry`.
"""
