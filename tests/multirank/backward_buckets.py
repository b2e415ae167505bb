"""Run one micro-batch through DeepSpeed's engine on one rank and print, as JSON, the bytes
of every ``torch.empty`` of exactly the gradient bucket's size made during its backward.

``python backward_buckets.py STAGE:PRECISION:OVERLAP ...``, one engine each: the tiny model, ladder's own
DeepSpeed config (runner.engine.deepspeed_config) with a bucket of BUCKET elements (a size no
other tensor of this model has), one rank on gloo.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import deepspeed
import torch

from runner.config import (
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    Precision,
    PrecisionConfig,
)
from runner.engine.deepspeed_config import build_deepspeed_config
from runner.engine.distributed import skip_inference_shm_op
from runner.layout import resolve_layout
from runner.model.transformer import build_model

BUCKET = 1_000_003


def bucket_allocations(stage: int, precision: Precision, overlap: bool) -> list[int]:
    """Bytes of each bucket-sized tensor made during one backward."""
    model_config = ModelConfig()
    config = build_deepspeed_config(
        layout=resolve_layout(gpus=1, tp=1, pp=1, global_size=4, micro_size=2),
        model=model_config,
        parallel=ParallelConfig(
            name=f"zero{stage}", zero_stage=stage, overlap_comm=overlap, reduce_bucket_size=BUCKET
        ),
        precision=PrecisionConfig(name=precision),
        optimizer=OptimizerConfig(),
        lr=1e-3,
    )
    bucket = config["zero_optimization"]["reduce_bucket_size"]
    dtype = torch.bfloat16 if precision == Precision.bf16 else torch.float32
    model = build_model(model_config, dtype=dtype)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    allocated: list[int] = []
    empty = torch.empty

    def recording_empty(*args: Any, **kwargs: Any) -> torch.Tensor:
        tensor = empty(*args, **kwargs)
        if tensor.numel() == bucket:
            allocated.append(tensor.numel() * tensor.element_size())
        return tensor

    tokens = torch.randint(0, model_config.vocab_size, (2, 33))
    loss = torch.nn.functional.cross_entropy(
        engine(tokens[:, :-1]).float().flatten(0, 1), tokens[:, 1:].flatten()
    )
    torch.empty = recording_empty  # type: ignore[assignment]
    try:
        engine.backward(loss)
    finally:
        torch.empty = empty  # type: ignore[assignment]
    return allocated


if __name__ == "__main__":
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    os.environ.setdefault("MASTER_PORT", "29637")
    skip_inference_shm_op()
    deepspeed.init_distributed(dist_backend="gloo")
    cases = [case.split(":") for case in sys.argv[1:]]
    found = {
        ":".join(case): bucket_allocations(int(case[0]), Precision(case[1]), case[2] == "true")
        for case in cases
    }
    print(json.dumps(found))
