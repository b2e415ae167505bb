"""A rank reads its place from its launcher's variables and arguments."""

from __future__ import annotations

import pytest

from runner.environment import take_local_rank_argument

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "argv",
    [
        ["train.py", "--local_rank=1", "gpus=2"],
        ["train.py", "--local-rank=1", "gpus=2"],
        ["train.py", "--local_rank", "1", "gpus=2"],
    ],
)
def test_the_deepspeed_launchers_local_rank_argument_leaves_hydras_command_line(argv):
    environ: dict[str, str] = {}
    take_local_rank_argument(argv, environ)
    assert argv == ["train.py", "gpus=2"]
    assert environ == {"LOCAL_RANK": "1"}


def test_local_rank_from_the_environment_wins_and_overrides_stay():
    argv = ["train.py", "--local_rank=0", "train.steps=3", "hydra.run.dir=x"]
    environ = {"LOCAL_RANK": "3"}
    take_local_rank_argument(argv, environ)
    assert argv == ["train.py", "train.steps=3", "hydra.run.dir=x"]
    assert environ == {"LOCAL_RANK": "3"}
