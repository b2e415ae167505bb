"""A parameter's name in the pipeline's layer list and in runner/model/transformer.py's Transformer.

runner/parallel/pipeline.py lays the model out as DeepSpeed's ``PipelineModule`` children: the
embedding (layer 0), the blocks (1..n_layer), the final norm (n_layer + 1) and the untied
output head (n_layer + 2); a tied embedding is DeepSpeed's ``tied_modules.<key>``. The
same weight has another name in the plain model. Initial values are drawn by the plain
name (so every layout starts alike), and a checkpoint moves between a pipeline and a
plain layout by renaming (runner/checkpoint/universal_conversion.py).
"""

from __future__ import annotations

from runner.config import ModelConfig

EMBED_KEY = "embed"  # the TiedLayerSpec key shared by the lookup and the output head


def model_name(cfg: ModelConfig, name: str) -> str:
    """The Transformer's name for the pipeline's parameter ``name`` (e.g. ``3.block.attention.wq.weight``)."""
    layer, _, param = name.partition(".")
    if layer == "tied_modules" or layer == "0":
        return "tok_embeddings.weight"  # tied_modules.embed.weight, or the untied lookup
    index = int(layer)
    if index <= cfg.n_layer:
        return f"layers.{index - 1}.{param.removeprefix('block.')}"
    return "norm.weight" if index == cfg.n_layer + 1 else "output.weight"


def pipeline_name(cfg: ModelConfig, model_param: str) -> str:
    """The pipeline's name for the Transformer parameter ``model_param``: :func:`model_name`'s inverse."""
    if model_param == "tok_embeddings.weight":
        return f"tied_modules.{EMBED_KEY}.weight" if cfg.tie_embeddings else "0.weight"
    if model_param == "norm.weight":
        return f"{cfg.n_layer + 1}.weight"
    if model_param == "output.weight":
        return f"{cfg.n_layer + 2}.weight"
    _, index, param = model_param.split(".", 2)  # layers.<i>.<param>
    return f"{int(index) + 1}.block.{param}"


__all__ = ["EMBED_KEY", "model_name", "pipeline_name"]
