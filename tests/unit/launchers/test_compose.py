"""Every shipped config composes into the typed root config; bad overrides fail with the key."""

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from train_helpers import ROOT

from launchers.compose import register_configs, to_train_config
from runner.config import Precision, TrainConfig

pytestmark = pytest.mark.unit

CONF = ROOT / "conf"
GROUPS = ["model", "optimizer", "precision", "parallel", "data", "cluster", "logger"]


def _options(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _compose(overrides):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.mark.parametrize(("group", "option"), [(g, o) for g in GROUPS for o in _options(g)])
def test_every_option_composes(group, option):
    config = to_train_config(_compose([f"{group}={option}"]))
    assert isinstance(config, TrainConfig)
    assert getattr(config, group).name == option or getattr(config, group).name.value == option


def test_typed_config_is_frozen():
    config = to_train_config(_compose(["precision=bf16", "gpus=2"]))
    assert config.precision.name == Precision.bf16
    with pytest.raises(AttributeError):
        config.gpus = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("model.n_layr=3", "n_layr"),
        ("gpus=two", "gpus"),
        ("precision.name=fp8", "fp8"),
        ("parallel=zero4", "zero4"),
    ],
)
def test_bad_overrides_fail_at_composition(override, fragment):
    with pytest.raises((ConfigCompositionException, ValueError)) as info:
        to_train_config(_compose([override]))
    text = f"{info.value} {info.value.__cause__}"
    assert fragment in text


EXPERIMENTS = _options("experiment")


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_an_experiment_is_the_same_whatever_the_layout(experiment):
    """experiment=<name> sets the experiment (model, precision, optimizer, data, batch, steps);
    parallel= and gpus= change only the layout, and the command line wins over the experiment."""
    on_8 = to_train_config(_compose([f"experiment={experiment}", "parallel=ddp", "gpus=8"]))
    on_32 = to_train_config(_compose([f"experiment={experiment}", "parallel=zero3", "gpus=32"]))
    default = to_train_config(_compose([]))
    for part in ("model", "precision", "optimizer", "data", "batch", "train", "seed"):
        assert getattr(on_8, part) == getattr(on_32, part), part
    assert on_8.batch != default.batch or on_8.model != default.model  # it changes the experiment
    assert (on_8.parallel.zero_stage, on_32.parallel.zero_stage) == (0, 3)
    mine = to_train_config(_compose([f"experiment={experiment}", "model=tiny", "train.steps=5"]))
    assert (mine.model.name, mine.train.steps, mine.batch) == ("tiny", 5, on_8.batch)


def test_the_nanogpt_experiment_is_nanogpts_gpt2_run():
    """karpathy/nanoGPT config/train_gpt2.py over train.py's defaults."""
    config = to_train_config(_compose(["experiment=gpt2_124m_nanogpt"]))
    assert (config.model.name, config.precision.name) == ("gpt2_124m", Precision.bf16)
    assert config.batch.global_size * config.data.seq_len == 12 * 1024 * 5 * 8  # 491,520 tokens
    optimizer = config.optimizer
    assert (optimizer.lr, optimizer.lr * optimizer.min_lr_ratio) == pytest.approx((6e-4, 6e-5))
    assert (optimizer.warmup_steps, optimizer.weight_decay, optimizer.grad_clip) == (2000, 0.1, 1.0)
    assert (optimizer.beta1, optimizer.beta2, config.train.steps) == (0.9, 0.95, 600_000)
    # eval_interval 1000, eval_iters 200 of 12 sequences a rank: 2,400, here 5 global batches of 480
    assert (config.train.eval_every, config.train.eval_batches * config.batch.global_size) == (1000, 2400)


def test_a_held_out_set_given_without_an_interval_is_evaluated_five_times():
    """data.val_path with train.eval_every=0 (its default) would leave the set unused and say nothing."""
    given = to_train_config(_compose(["data.val_path=/data/val.bin", "train.steps=60"]))
    assert given.train.eval_every == 12
    assert to_train_config(_compose(["data.val_path=/data/val.bin", "train.steps=3"])).train.eval_every == 1
    chosen = to_train_config(_compose(["data.val_path=/data/val.bin", "train.eval_every=7"]))
    assert chosen.train.eval_every == 7
    assert to_train_config(_compose([])).train.eval_every == 0  # no held-out set: no evaluation
