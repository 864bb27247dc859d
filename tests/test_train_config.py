"""The trainer's run config checks, learning-rate rules and command-line failures (no training)."""

import json
import logging
import math

import pytest

from scalestudy.plan import runconfig, schema
from scalestudy.train import optim, program

VALID = {
    "data_dir": "d",
    "checkpoint_dir": "c",
    "world_size": 4,
    "per_gpu_batch": 128,
    "global_batch": 512,
    "epochs": 2,
}


def _validated(**changes):
    config = {**runconfig.DEFAULTS, **VALID, **changes}
    runconfig.validate(config)
    return config


def test_the_documented_example_run_config_is_accepted():
    example = {
        **VALID,
        "stage": "scaling",
        "point": "strong/w2_r0",
        "nodes": 1,
        "precision": "bf16",
        "comm_hook": "fp16",
        "profile": {"tool": "torch", "start_step": 20, "steps": 10},
    }
    assert set(example) <= set(runconfig.DEFAULTS) | set(runconfig.REQUIRED)
    _validated(**example)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"global_batch": 256}, "global_batch=256 is not per_gpu_batch=128 x world_size=4"),
        ({"precision": "fp8"}, "precision='fp8'"),
        ({"lr_scaling": "cubic"}, "lr_scaling='cubic'"),
        ({"loader": "dali"}, "loader='dali'"),
        ({"comm_hook": "powersgd"}, "comm_hook='powersgd'"),
        ({"norm": "layer"}, "norm='layer'"),
        ({"width": 0}, "width=0"),
        ({"epochs": 1.5}, "epochs=1.5"),
        ({"data_dir": None}, "data_dir is required"),
        ({"nesterov": True, "momentum": 0.0}, "momentum=0.0"),
        ({"profile": {"tool": "auto", "start_step": 2, "steps": 2}}, "tool='auto'"),
        ({"profile": {"tool": "torch", "start_step": 2, "steps": 0}}, "steps >= 1"),
    ],
)
def test_bad_run_configs_name_the_key_and_value(changes, message):
    with pytest.raises(runconfig.RunConfigError, match=message.replace("(", r"\(")):
        _validated(**changes)


def test_learning_rate_scaling_rules():
    assert optim.lr_scale("linear", 1024, 128) == 8
    assert optim.lr_scale("sqrt", 512, 128) == 2
    assert optim.lr_scale("none", 1024, 128) == 1


def test_schedule_warms_up_linearly_then_decays_by_cosine_to_zero():
    factor = optim.lr_schedule(warmup_steps=4, total_steps=14)
    assert [factor(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert factor(4) == 1.0
    assert factor(9) == pytest.approx(0.5)  # half-way through the decay
    assert factor(14) == pytest.approx(0.0, abs=1e-12)
    decay = [factor(s) for s in range(4, 15)]
    assert decay == sorted(decay, reverse=True)
    assert optim.lr_schedule(0, 10)(0) == 1.0
    assert optim.lr_schedule(0, 10)(5) == pytest.approx(0.5 * (1 + math.cos(math.pi / 2)))


def _main(tmp_path, config):
    return program.main(["--run-config-json", json.dumps(config), "--out-dir", str(tmp_path / "run")])


def test_a_world_size_that_the_environment_does_not_have_is_refused(tmp_path, capsys, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(name, raising=False)
    assert _main(tmp_path, VALID) == program.EXIT_BAD_CONFIG
    assert "world_size=4" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("argument", "message"), [("[1, 2]", "must be a JSON object"), ("{'a': 1}", "not valid JSON")]
)
def test_unreadable_run_configs_are_refused(tmp_path, capsys, argument, message):
    # main() sets up logging to stderr itself (replacing caplog's handler), so read stderr
    code = program.main(["--run-config-json", argument, "--out-dir", str(tmp_path)])
    assert code == program.EXIT_BAD_CONFIG and message in capsys.readouterr().err


def test_unknown_keys_are_named_in_a_warning(tmp_path, caplog):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({**VALID, "world_size": 1, "global_batch": 128, "lerning_rate": 1}))
    args = program.parse_args(["--run-config", str(path), "--out-dir", str(tmp_path)])
    with caplog.at_level(logging.WARNING):
        given, config = runconfig.load_run_config(args)
    assert "lerning_rate" in caplog.text
    assert given["global_batch"] == 128
    assert config["precision"] == runconfig.schema_default(("train", "precision"))


# --- bad values, each named (JSON's true/false are not numbers) ------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"per_gpu_batch": True, "global_batch": 4}, "per_gpu_batch=True must be an integer >= 1"),
        ({"epochs": True}, "epochs=True must be an integer >= 1"),
        ({"world_size": 4.0}, "world_size=4.0 must be an integer"),
        ({"lr": True}, "lr=True must be a number > 0"),
        ({"lr": "fast"}, "lr='fast' must be a number > 0"),
        ({"lr": float("nan")}, "lr=nan must be a number"),
        ({"lr": float("inf")}, "lr=inf must be a number"),
        ({"weight_decay": -0.1}, "weight_decay=-0.1 must be a number >= 0"),
        ({"seed": -1}, "seed=-1 must be an integer >= 0"),
        ({"seed": 2**32}, "seed=4294967296 must be an integer >= 0 and <= 4294967295"),
        ({"max_steps_per_epoch": 0}, "max_steps_per_epoch=0 must be an integer >= 1 or null"),
        ({"max_steps_per_epoch": -3}, "max_steps_per_epoch=-3"),
        ({"eval_max_batches": 0}, "eval_max_batches=0 must be an integer >= 1 or null"),
        ({"nesterov": "yes"}, "nesterov='yes' must be true or false"),
        ({"deterministic": 1}, "deterministic=1 must be true or false"),
        ({"momentum": 1.5}, "momentum=1.5 must be a number >= 0 and <= 1"),
        ({"label_smoothing": -0.1}, "label_smoothing=-0.1"),
        ({"pg_timeout_s": 0}, "pg_timeout_s=0 must be a number > 0"),
        ({"num_workers": -1}, "num_workers=-1 must be an integer >= 0"),
        ({"target_accuracy": 0}, "target_accuracy=0 must be a number > 0 and <= 1"),
        ({"data_dir": ""}, "data_dir='' must be a non-empty string"),
        ({"checkpoint_dir": 3}, "checkpoint_dir=3 must be a non-empty string"),
        ({"device": "tpu"}, "device='tpu' must be one of auto, cuda, cpu"),
        ({"profile": "torch"}, "profile='torch' must be a JSON object or null"),
        ({"profile": {"tool": "torch", "start_step": True, "steps": 2}}, "profile.start_step=True"),
    ],
)
def test_values_of_the_wrong_type_or_range_are_named(changes, message):
    with pytest.raises(runconfig.RunConfigError, match=message):
        _validated(**changes)


def test_every_key_has_a_rule_and_every_default_passes_it():
    assert set(runconfig.RULES) == set(runconfig.DEFAULTS) | set(runconfig.REQUIRED)
    for key, value in runconfig.DEFAULTS.items():
        assert runconfig.RULES[key].accepts(value), key


# --- the schema is the one home of each key's type and range ------------------------------------

PROBES = (
    None,
    True,
    False,
    -1,
    0,
    1,
    0.5,
    1.5,
    2**32 - 1,
    2**32,
    "",
    "x",
    "none",
    "ddp",
    "fp32",
    "auto",
    {},
    [],
)


def _schema_accepts(key, value) -> bool:
    import jsonschema

    path = {**runconfig.STUDY_KEYS, "epochs": ("train", "epochs"), "workload": ("workload", "name")}.get(key)
    entry = schema.node(*path) if path else schema.definition("run_config")["properties"][key]
    document = {"$defs": schema.load()["$defs"], **entry}
    return jsonschema.Draft202012Validator(document).is_valid(value)


@pytest.mark.parametrize("key", sorted(set(runconfig.DEFAULTS) | set(runconfig.REQUIRED)))
def test_the_trainer_accepts_exactly_what_the_schema_accepts(key):
    """Every run-config key: the trainer's check and JSON Schema's own reading of the schema entry
    agree on every probe value (the study settings' entries are the study config's)."""
    disagree = [v for v in PROBES if runconfig.RULES[key].accepts(v) != _schema_accepts(key, v)]
    assert disagree == [], key


@pytest.mark.parametrize("key", ["checkpoint_every_steps", "step_timing_every", "log_every_steps"])
def test_a_step_interval_of_0_or_null_means_never_and_a_negative_one_is_named(key):
    assert _validated(**{key: 0})[key] == 0 and _validated(**{key: None})[key] is None
    with pytest.raises(runconfig.RunConfigError, match=f"{key}=-1 must be an integer >= 0 or null"):
        _validated(**{key: -1})


def test_the_run_config_module_gives_no_range_or_choices_of_its_own():
    """Every Rule is made from a schema entry (rule_of): runconfig.py gives none a literal bound or
    literal choices (a planted `Rule("integer", minimum=1)` is found)."""
    import ast
    import inspect

    def literal_rules(source: str) -> list[str]:
        def literal(node):
            numeric = isinstance(node, ast.Constant) and isinstance(node.value, int | float)
            return numeric or isinstance(node, ast.Tuple | ast.List)

        return [
            ast.unparse(node)
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "Rule"
            and any(literal(arg) for arg in [*node.args, *(keyword.value for keyword in node.keywords)])
        ]

    assert literal_rules(inspect.getsource(runconfig)) == []
    assert literal_rules('Rule("integer", minimum=1)\nRule("choice", choices=("a",))') == [
        "Rule('integer', minimum=1)",
        "Rule('choice', choices=('a',))",
    ]


def test_a_schema_entry_the_trainer_cannot_check_is_refused():
    with pytest.raises(ValueError, match="a Rule cannot check"):
        schema.rule_of({"type": "number", "multipleOf": 2})
    with pytest.raises(ValueError, match="a Rule cannot check"):
        schema.rule_of({"type": "string"})  # a string the trainer takes is a non-empty one
    with pytest.raises(ValueError, match="a Rule cannot check"):
        schema.rule_of({"type": "array"})
    assert schema.rule_of({"$ref": "#/$defs/positive_int"}) == schema.Rule("integer", minimum=1)
    share = schema.rule_of({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1})
    assert share.accepts(0.5) and not share.accepts(1) and not share.accepts(0)
    assert share.describe() == "a number > 0 and < 1"


def test_several_bad_keys_are_named_in_one_message():
    with pytest.raises(runconfig.RunConfigError) as error:
        _validated(epochs=True, lr="fast", seed=-1)
    assert all(key in str(error.value) for key in ("epochs=True", "lr='fast'", "seed=-1"))


# --- the command line: files and folders, checked before anything starts ------------------------------


@pytest.fixture
def single_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(name, raising=False)


def _one_rank(tmp_path, **changes):
    data = tmp_path / "packed"
    data.mkdir(exist_ok=True)
    config = {**VALID, "world_size": 1, "global_batch": 128, "data_dir": str(data)}
    return {**config, "checkpoint_dir": str(tmp_path / "ckpt"), **changes}


def _refused(capsys, argv, *expected):
    code = program.main(argv)
    err = capsys.readouterr().err
    assert code == program.EXIT_BAD_CONFIG, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert all(text in err for text in expected), err
    return err


def test_a_missing_run_config_file_is_named(tmp_path, capsys):
    missing = tmp_path / "nope.json"
    _refused(capsys, ["--run-config", str(missing), "--out-dir", str(tmp_path / "run")], str(missing))


def test_a_run_config_file_that_is_not_utf8_is_named(tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_bytes(json.dumps(_one_rank(tmp_path, point="caf\u00e9"), ensure_ascii=False).encode("latin-1"))
    _refused(capsys, ["--run-config", str(path), "--out-dir", str(tmp_path / "run")], str(path), "UTF-8")


def test_a_checkpoint_dir_that_is_a_file_is_refused_before_training(tmp_path, capsys, single_process):
    (tmp_path / "ckpt").write_text("a file")
    config = _one_rank(tmp_path)
    out = tmp_path / "run"
    _refused(
        capsys, ["--run-config-json", json.dumps(config), "--out-dir", str(out)], "checkpoint_dir", "file"
    )
    assert not out.exists()


@pytest.mark.parametrize("where", ["run", "run/inside"])
def test_an_out_dir_that_is_or_lies_under_a_file_is_refused_before_training(
    tmp_path, capsys, single_process, where
):
    (tmp_path / "run").write_text("a file")
    argv = ["--run-config-json", json.dumps(_one_rank(tmp_path)), "--out-dir", str(tmp_path / where)]
    _refused(capsys, argv, "--out-dir", "is a file")
    assert not (tmp_path / "ckpt").exists()


def test_a_missing_data_dir_is_refused(tmp_path, capsys, single_process):
    config = _one_rank(tmp_path, data_dir=str(tmp_path / "absent"))
    _refused(
        capsys, ["--run-config-json", json.dumps(config), "--out-dir", str(tmp_path / "run")], "data_dir"
    )


def test_garbage_data_arrays_are_named_with_exit_2(tmp_path, capsys, single_process):
    config = _one_rank(tmp_path, per_gpu_batch=4, global_batch=4, width=4)
    for name in ("train_images", "train_labels", "test_images", "test_labels"):
        (tmp_path / "packed" / f"{name}.npy").write_bytes(b"\x93NUMPY garbage " * 10)
    argv = ["--run-config-json", json.dumps(config), "--out-dir", str(tmp_path / "run")]
    _refused(capsys, argv, "train_images.npy", "not a .npy array")
    assert not (tmp_path / "run").exists() and not (tmp_path / "ckpt").exists()
