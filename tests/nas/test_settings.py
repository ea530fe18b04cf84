"""The typed settings agree with the parts they configure (no processes, no Hydra)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from nas import settings
from nas.settings.pipeline import PIPEMARE_OPTIONS
from nas.study.strategies import no_pruning, pruner_options, study_pruner
from pipeline.local.pipemare import PipeMareConfig
from pipeline.pure.planner import PLANNERS
from pipeline.pure.schedule import SCHEDULES
from search_spaces.evolved_transformer import PRIMITIVES


def test_every_schedule_and_planner_of_the_runtime_can_be_configured() -> None:
    for planner in PLANNERS:
        assert settings.PipelineSettings(planner=planner).planner == planner
    valid = f"valid planners: {', '.join(PLANNERS)}, or a class as 'package.module:ClassName'$"
    with pytest.raises(ValueError, match=f"pipeline.planner='greedy' is not valid; {valid}"):
        settings.PipelineSettings(planner="greedy")
    listed = settings.what_is_valid(settings.NasSettings, "pipeline.schedule")
    assert listed == f"valid schedules: {', '.join(SCHEDULES)}"


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_a_pipeline_setting_takes_each_schedule(schedule: str) -> None:
    assert settings.PipelineSettings(schedule=schedule).schedule == schedule


def test_pipemare_options_are_the_runtimes() -> None:
    assert set(PIPEMARE_OPTIONS) == set(PipeMareConfig.__dataclass_fields__)
    with pytest.raises(ValueError, match=r"unknown options \['decay'\]"):
        settings.PipelineSettings(schedule="pipemare", pipemare={"decay": 0.5})
    with pytest.raises(ValueError, match="apply to schedule=pipemare only"):
        settings.PipelineSettings(schedule="1f1b", pipemare={"update_every": 2})


def test_pipemare_takes_only_a_constant_rate() -> None:
    """PipeMare's T1 sets the rates itself: the runtime takes no lr_scheduler under it."""
    pipemare = settings.PipelineSettings(schedule="pipemare")
    assert settings.NasSettings(pipeline=pipemare).train.lr_schedule == "constant"
    with pytest.raises(ValueError, match="train.lr_schedule='cosine' with train.warmup_steps=0"):
        settings.NasSettings(pipeline=pipemare, train=settings.TrainSettings(lr_schedule="cosine"))
    with pytest.raises(ValueError, match="valid: train.lr_schedule=constant"):
        settings.NasSettings(pipeline=pipemare, train=settings.TrainSettings(warmup_steps=5))


def test_pdh_budgets_must_be_evaluation_steps() -> None:
    with pytest.raises(ValueError, match=r"budgets=\[15\] has \[15\], not an evaluation step"):
        settings.NasSettings(
            train=settings.TrainSettings(steps=60, eval_every=20),
            pruner=settings.PrunerSettings("pdh", {"budgets": [15]}),
        )


def test_the_top_rung_of_the_hurdles_is_the_full_training_length() -> None:
    train = settings.TrainSettings(steps=60, eval_every=20)
    made = settings.NasSettings(
        train=train, pruner=settings.PrunerSettings("pdh", {"budgets": [20]})
    )
    assert made.pruner.options["budgets"] == [20]  # the settings keep what the user wrote
    assert pruner_options(made) == {"budgets": [20], "max_resource": 60}
    assert study_pruner(made).budgets == (20, 60)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"budgets=\[20, 80\] has \[80\]"):
        settings.NasSettings(
            train=train, pruner=settings.PrunerSettings("pdh", {"budgets": [20, 80]})
        )


def test_the_space_primitives_are_the_search_spaces() -> None:
    assert settings.SearchSpaceSettings(primitives=PRIMITIVES).primitives == PRIMITIVES
    assert settings.SearchSpaceSettings(primitives=("mdha",)).primitives == ("mdha",)
    with pytest.raises(
        ValueError, match=f"search_space.primitives.*'gelu'.*{', '.join(PRIMITIVES)}"
    ):
        settings.SearchSpaceSettings(primitives=("gelu",))


def test_the_window_is_relative_to_a_seed_the_space_has() -> None:
    space = settings.SearchSpaceSettings(window_reference="evolved_transformer")
    assert space.window_reference == "evolved_transformer"
    with pytest.raises(
        ValueError,
        match="search_space.window_reference='vit' is not valid; valid values: transformer, "
        "evolved_transformer",
    ):
        settings.SearchSpaceSettings(window_reference="vit")


def test_a_multi_objective_study_says_when_its_pruner_cannot_prune_it() -> None:
    two = settings.StudySettings(objectives=("validation_loss", "tokens_per_s"))
    median = settings.PrunerSettings("median")
    said = no_pruning(settings.NasSettings(study=two, pruner=median))
    assert said is not None and said.startswith("pruner median judges one objective")
    assert said.endswith("alone: pdh, none)")  # those that can, read from the registry
    hurdles = settings.PrunerSettings("pdh", {"budgets": [20]})
    assert no_pruning(settings.NasSettings(study=two, pruner=hurdles)) is None
    assert no_pruning(settings.NasSettings(pruner=median)) is None  # one objective: any pruner


@pytest.mark.parametrize(
    "stages,valid",
    [
        (("search",), True),
        (("retrain",), True),
        (("search", "retrain"), True),
        ((), False),
        (("retrain", "search"), False),
        (("search", "search"), False),
        (("export",), False),
    ],
)
def test_stages_run_in_order_each_once(stages: tuple[str, ...], valid: bool) -> None:
    if valid:
        assert settings.NasSettings(stages=stages).stages == stages
    else:
        with pytest.raises(ValueError, match=r"stages=.* is not valid; valid: \[search\]"):
            settings.NasSettings(stages=stages)


@pytest.mark.parametrize(
    "retrain,message",
    [
        ({"top_k": 0}, "retrain.top_k=0 is not valid"),
        ({"steps": -5}, "retrain.steps=-5 is not valid"),
        ({"decode_pairs": 0}, "retrain.decode_pairs=0 is not valid"),
        ({"seeds": ()}, r"retrain.seeds=\[\] is not valid; use a non-empty list of integers"),
        ({"seeds": (1, 1)}, r"retrain.seeds=\[1, 1\] names a seed twice"),
        ({"seeds": (0.5,)}, r"retrain.seeds=\[0.5\] is not valid"),
        ({"selection_seeds": (4, 4)}, r"retrain.selection_seeds=\[4, 4\] is not valid"),
        (
            {"seeds": (1, 2, 3), "selection_seeds": (3, 4)},
            r"selection_seeds=\[3, 4\] share \[3\] with retrain.seeds=\[1, 2, 3\]: the seeds "
            "that judge must play no part in the choice",
        ),
    ],
)
def test_retrain_settings_name_the_bad_value(retrain: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        settings.RetrainSettings(**retrain)


@pytest.mark.parametrize(
    "train,message",
    [
        ({"lr_schedule": "step"}, "train.lr_schedule='step' is not valid"),
        ({"warmup_steps": -1}, "train.warmup_steps=-1 is not valid; use a count >= 0"),
        ({"min_lr_ratio": 1.5}, r"train.min_lr_ratio=1.5 is not valid; it must be in \[0, 1\]"),
    ],
)
def test_learning_rate_settings_name_the_bad_value(train: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        settings.TrainSettings(**train)


def test_lower_is_better_signs_a_metric_by_its_direction() -> None:
    assert settings.lower_is_better("validation_loss", 0.5) == 0.5
    assert settings.lower_is_better("validation_chrf", 60.0) == -60.0
    assert (
        settings.lower_is_better("validation_chrf", math.nan) == math.inf
    )  # a failed run ranks last


def test_an_objective_only_decoding_measures_needs_pairs_decoded() -> None:
    def configured(
        objectives: tuple[str, ...], decode_pairs: int = 4, final_decode_pairs: int = 8
    ) -> settings.NasSettings:
        return settings.NasSettings(
            study=settings.StudySettings(objectives=objectives),
            train=settings.TrainSettings(
                decode_pairs=decode_pairs, final_decode_pairs=final_decode_pairs
            ),
        )

    with pytest.raises(ValueError, match="train.decode_pairs=0 decodes no pair, but study"):
        configured(("validation_chrf",), decode_pairs=0)  # the fitness, at every evaluation
    with pytest.raises(ValueError, match="objectives has validation_exact_match, which only"):
        configured(("validation_loss", "validation_exact_match"), final_decode_pairs=0)
    configured(("validation_loss", "validation_chrf"), decode_pairs=0)  # scored at the end
    configured(("validation_loss",), decode_pairs=0, final_decode_pairs=0)


def test_the_shape_is_auto_by_default_and_a_number_when_set() -> None:
    pipe = settings.PipelineSettings()
    assert pipe.auto_keys == ("n_stages", "n_microbatches", "threads_per_stage")
    assert settings.StudySettings().workers == settings.AUTO
    fixed = settings.PipelineSettings(n_stages=2, n_microbatches=4, threads_per_stage=1)
    assert (fixed.auto_keys, fixed.stage_count, fixed.microbatch_count) == ((), 2, 4)
    with pytest.raises(RuntimeError, match="pipeline.n_stages is 'auto'"):
        _ = pipe.stage_count


@pytest.mark.parametrize(
    "make,words",
    [
        (lambda: settings.StudySettings(workers=0), "study.workers=0"),
        (lambda: settings.StudySettings(workers="many"), "study.workers='many'"),
        (lambda: settings.PipelineSettings(n_stages="x"), "pipeline.n_stages='x'"),
        (lambda: settings.PipelineSettings(threads_per_stage=-1), "threads_per_stage=-1"),
    ],
)
def test_a_bad_shape_value_names_the_key_and_auto(make: Callable[[], object], words: str) -> None:
    with pytest.raises(ValueError, match=f"{words}.*or 'auto'"):
        make()


def test_a_fixed_microbatch_count_must_divide_the_batch() -> None:
    with pytest.raises(ValueError, match="not a multiple of pipeline.n_microbatches=3"):
        settings.NasSettings(pipeline=settings.PipelineSettings(n_microbatches=3))
    auto = settings.NasSettings(train=settings.TrainSettings(batch_size=30))
    assert auto.pipeline.n_microbatches == settings.AUTO  # chosen later among the divisors


def test_one_problem_per_bad_value_each_naming_its_dotted_key() -> None:
    with pytest.raises(settings.SettingsError) as raised:
        settings.RetrainSettings(top_k=0, seeds=(1, 1), claim_wait_s=math.inf)
    assert [p.split("=")[0] for p in raised.value.problems] == [
        "retrain.top_k",
        "retrain.seeds",
        "retrain.claim_wait_s",
    ]
    assert "retrain.claim_wait_s=inf is not valid; use seconds > 0" in raised.value.problems[2]


def test_a_value_of_the_wrong_type_from_python_is_refused_as_from_yaml() -> None:
    with pytest.raises(ValueError, match="train.steps='5' is not valid; it must be a positive"):
        settings.TrainSettings(steps="5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="study.enqueue_seeds=1 is not valid; use true or false"):
        settings.StudySettings(enqueue_seeds=1)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"train.dropout=True is not valid; it must be in \[0, 1\)"
    ):
        settings.TrainSettings(dropout=True)


def test_the_whole_is_checked_again_with_every_part() -> None:
    """A part changed after it was made is refused with the whole (every part is walked)."""
    made = settings.NasSettings()
    made.train.steps = 0
    with pytest.raises(ValueError, match="train.steps=0 is not valid"):
        settings.NasSettings(train=made.train)


def test_cross_field_rules_wait_for_the_fields() -> None:
    """min_cells=0 is named alone, not also as cells out of order."""
    with pytest.raises(settings.SettingsError) as raised:
        settings.SearchSpaceSettings(min_cells=0, max_cells=3)
    assert raised.value.problems == (
        "search_space.min_cells=0 is not valid; it must be a positive integer",
    )
    with pytest.raises(ValueError, match=r"cells 3\.\.2 must satisfy 1 <= min_cells <= max_cells"):
        settings.SearchSpaceSettings(min_cells=3, max_cells=2)


def test_what_is_valid_is_read_from_the_declarations() -> None:
    assert settings.what_is_valid(settings.NasSettings, "train.steps") == (
        "it must be a positive integer"
    )
    assert "or 'auto'" in str(settings.what_is_valid(settings.NasSettings, "study.workers"))
    assert settings.what_is_valid(settings.NasSettings, "task.options.path") is None
    assert settings.what_is_valid(settings.NasSettings, "train.no_such_key") is None
    assert settings.keys_of(settings.NasSettings, "retrain")[:2] == ("top_k", "seeds")
    assert "study" in settings.keys_of(settings.NasSettings, "")
    assert settings.keys_of(settings.NasSettings, "task.options") == ()


def test_a_task_option_the_task_does_not_take_is_named_with_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown options \['vocab_sise'\]; valid options: .*"):
        settings.TaskSettings("translation", {"vocab_sise": 100})
    with pytest.raises(ValueError, match="missing a required argument: 'path'"):
        settings.TaskSettings("corpus", {})
    with pytest.raises(ValueError, match="tokenizer='wordpiece' is not valid; valid tokenizers"):
        settings.TaskSettings("translation", {"tokenizer": "wordpiece"})
    assert settings.TaskSettings("translation", {"vocab_size": 100}).options == {"vocab_size": 100}


def test_every_key_but_free_ones_declares_what_is_valid() -> None:
    """The keys the CLI cannot say the valid values of, for a wrong type: names and options
    the parts themselves check when built, and paths."""
    undeclared = []
    for part in settings.keys_of(settings.NasSettings, ""):
        keys = settings.keys_of(settings.NasSettings, part) or ("",)
        for key in (f"{part}.{k}" if k else part for k in keys):
            if settings.what_is_valid(settings.NasSettings, key) is None:
                undeclared.append(key)
    assert sorted(undeclared) == [
        "output_dir",
        "pruner.options",
        "sampler.options",
        "search_space.param_window",
        "studies_dir",
        "task.options",
        "tracker.options",
    ]
