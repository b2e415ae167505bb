"""The memory ledger: what a rank really holds, by term, beside what the estimator predicts.

Measured (per rank, bytes, each storage counted once):

- ``params``: the model's parameter storages this rank holds (at ZeRO-3 the partition,
  ``param.ds_tensor``; full copies of gathered or persistent parameters are a residual);
- ``grads``: parameter ``.grad`` storages and the gradient partitions the ZeRO optimizer
  keeps (``averaged_gradients``, ``grad_partitions_flat_buffer``);
- ``optimizer``: the inner optimizer's state (Adam's m and v, SGD's momentum) and, in
  16-bit training, the fp32 master weights it steps;
- ``activations``: tensors autograd saved for backward over one micro-batch
  (``torch.autograd.graph.saved_tensors_hooks``), parameters and buffers excluded;
- residuals: every other tensor reachable from DeepSpeed's optimizer wrapper, named by
  the attribute that holds it (communication buckets, an fp32 master copy in fp32
  training, ZeRO-Offload's host buffers, ...), plus ZeRO-3's full copies of persistent
  parameters. Under ZeRO-3 offload the 16-bit gradient partitions
  (``grad_partitions_flat_buffer``) are such a residual: the ``grads`` term is the fp32
  partition the CPU optimizer steps on, as in the estimate.

Model states are measured at the accumulation boundary, after backward and DeepSpeed's
gradient reduction, before the optimizer step, on the second step (the optimizer state
exists from the first). What is transient inside backward (ZeRO-1's full gradients
before the reduce-scatter, say) is not held then: the peak sees it.

Estimated: the estimator's boundary estimate (runner/memory_model/boundary.py, re-exported
here as ``Estimate``, ``RankBatch``, ``boundary_estimate`` and ``deepspeed_estimate``), the
same model states, device buffers and host lines the plan counts. :func:`relative_errors` and
:func:`host_relative_errors` compare it with the measured lines of the same names.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from runner.config import Precision
from runner.engine.deepspeed_engine import DeepSpeedEngine
from runner.memory_model.boundary import Estimate, RankBatch, boundary_estimate, deepspeed_estimate
from runner.model.op_recompute import kept_outputs

TERMS = ("params", "grads", "optimizer", "activations")

# Attributes of DeepSpeed's ZeRO optimizers (stage_1_and_2.py, stage3.py) holding gradients.
_GRADIENT_ATTRS = frozenset(
    {
        "averaged_gradients",
        "grad_partitions_flat_buffer",
        "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition",
    }
)
# Attributes holding the fp32 weights the inner optimizer steps (its master weights).
_MASTER_ATTRS = frozenset({"single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups"})
_WALK_DEPTH = 6


@dataclass
class Ledger:
    """Bytes per term and named residuals of one rank."""

    terms: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TERMS, 0))
    residual: dict[str, int] = field(default_factory=dict)

    def add_residual(self, name: str, nbytes: int) -> None:
        """Accumulate a named residual line."""
        if nbytes:
            self.residual[name] = self.residual.get(name, 0) + nbytes


def fullest_device(ledger: Ledger) -> Ledger:
    """Each term (and residual line) at its largest over all ranks (every rank must call this).

    What the fullest device holds, the one a plan must fit: a pipeline's stages differ, and
    so do ZeRO-1/2's gradient buffers (runner.memory_model.zero12_held_elements).
    """
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (ledger.terms, ledger.residual))
    merged = Ledger()
    for terms, residual in everyone:
        for term in TERMS:
            merged.terms[term] = max(merged.terms[term], terms[term])
        for name, nbytes in residual.items():
            merged.residual[name] = max(merged.residual.get(name, 0), nbytes)
    return merged


def _storage(tensor: torch.Tensor) -> tuple[int, int] | None:
    if tensor.numel() == 0 or tensor.device.type == "meta":
        return None
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


class _Counter:
    """Counts each storage once, into the first category that claims it."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.seen: set[int] = set()

    def claim(self, tensor: Any, term: str | None, residual: str | None = None) -> None:
        if not isinstance(tensor, torch.Tensor):
            return
        found = _storage(tensor)
        if found is None or found[0] in self.seen:
            return
        ptr, nbytes = found
        self.seen.add(ptr)
        if term is not None:
            self.ledger.terms[term] += nbytes
        else:
            self.ledger.add_residual(residual or "unnamed", nbytes)


def _tensors_in(obj: Any, depth: int = 0, visited: set[int] | None = None) -> Iterator[torch.Tensor]:
    """Tensors reachable through lists, tuples, dicts and DeepSpeed/torch.optim objects."""
    visited = set() if visited is None else visited
    if depth > _WALK_DEPTH or id(obj) in visited:
        return
    visited.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
        # Only a leaf (or a tensor that retains its grad) has one; asking a non-leaf warns.
        if (obj.is_leaf or obj.retains_grad) and obj.grad is not None:
            yield obj.grad
    elif isinstance(obj, torch.nn.Module):
        return
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors_in(item, depth + 1, visited)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors_in(item, depth + 1, visited)
    elif type(obj).__module__.startswith(("deepspeed", "torch.optim")) and hasattr(obj, "__dict__"):
        for item in vars(obj).values():
            yield from _tensors_in(item, depth + 1, visited)


def measure_model_states(engine: DeepSpeedEngine, *, precision: Precision) -> Ledger:
    """Params, grads, optimizer states and residuals held by this rank now.

    Each storage counts once, in the first place that claims it, in this order: the model's
    parameters and buffers, the inner optimizer's state and master weights, then every other
    tensor DeepSpeed's optimizer wrapper holds.
    """
    ledger = Ledger()
    count = _Counter(ledger)
    _claim_model(count, engine.module)
    wrapper = engine.optimizer
    inner = getattr(wrapper, "optimizer", wrapper)
    master_term = _master_term(precision)
    _claim_inner_optimizer(count, inner, master_term)
    if wrapper is not inner:
        _claim_wrapper(count, wrapper, master_term)
    return ledger


def _master_term(precision: Precision) -> tuple[str | None, str | None]:
    """Where the fp32 master weights count, as ``_Counter.claim``'s (term, residual)."""
    # In 16-bit training the fp32 master weights are part of the optimizer states
    # (ZeRO paper Sec. 3.1: K = 12 counts them); in fp32 training they are an extra copy.
    return (None, "fp32_master_copy") if precision == Precision.fp32 else ("optimizer", None)


def _claim_model(count: _Counter, module: torch.nn.Module) -> None:
    """The parameters (ZeRO-3's partitions first), their gradients, and the module's buffers."""
    params = list(module.parameters())
    for param in params:
        partition = getattr(param, "ds_tensor", None)
        if partition is not None:  # ZeRO-3: the partition is this rank's share
            count.claim(partition, "params")
    for param in params:
        if getattr(param, "ds_tensor", None) is not None:
            count.claim(param.data, None, "zero3_full_params (persistent or gathered)")
        else:
            count.claim(param.data, "params")
        count.claim(param.grad, "grads")
    for buffer in module.buffers():
        count.claim(buffer, None, "model_buffers")


def _claim_inner_optimizer(count: _Counter, inner: Any, master_term: tuple[str | None, str | None]) -> None:
    """The inner optimizer's state (Adam's m and v), and the weights it steps with their gradients."""
    for state in inner.state.values():
        for value in state.values():
            count.claim(value, "optimizer")
    for group in inner.param_groups:
        for master in group["params"]:
            count.claim(master.grad, "grads")
            count.claim(master, *master_term)


def _claim_wrapper(count: _Counter, wrapper: Any, master_term: tuple[str | None, str | None]) -> None:
    """What DeepSpeed's ZeRO wrapper holds beyond its inner optimizer, each line named by its attribute."""
    # A master partition's ``.grad`` is the gradient partition the inner optimizer steps
    # on: under offload it stays there between steps (stage3.py
    # initialize_optimizer_states), a gradient and not a master weight.
    for name in _MASTER_ATTRS:
        for master in _tensors_in(vars(wrapper).get(name)):
            count.claim(master.grad, "grads")
    if getattr(wrapper, "offload_optimizer", False):
        # ZeRO-3 offload keeps its 16-bit gradient partitions on the host beside the fp32
        # ones: a buffer of DeepSpeed's own (runner.memory_model.offload_host_buffers).
        count.claim(
            getattr(wrapper, "grad_partitions_flat_buffer", None), None, "grad_partitions_flat_buffer"
        )
    for name, value in vars(wrapper).items():
        if name in ("optimizer", "module"):
            continue
        if name in _MASTER_ATTRS:
            where = master_term
        elif name in _GRADIENT_ATTRS:
            where = ("grads", None)
        else:
            where = (None, name.split("__")[-1])
        for tensor in _tensors_in(value):
            count.claim(tensor, *where)


@contextlib.contextmanager
def saved_activations(model: torch.nn.Module) -> Iterator[dict[str, int]]:
    """Count bytes autograd saves for backward inside the block: ``{"activations": bytes}``."""
    excluded = {p.untyped_storage().data_ptr() for p in model.parameters() if p.numel()}
    excluded |= {b.untyped_storage().data_ptr() for b in model.buffers() if b.numel()}
    seen: set[int] = set()
    result = {"activations": 0}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        # A view of a parameter is a weight too: AutoTP's layers save weight.transpose(),
        # whose storage at ZeRO-3 is the gathered copy, not one listed in ``excluded``.
        if isinstance(tensor, torch.nn.Parameter) or isinstance(tensor._base, torch.nn.Parameter):
            return tensor
        found = _storage(tensor)
        if found is not None and found[0] not in excluded and found[0] not in seen:
            seen.add(found[0])
            result["activations"] += found[1]
        return tensor

    # Op-level selective recompute keeps its outputs in torch's own cache, not as saved tensors.
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), kept_outputs() as kept:
        yield result
    for outputs in kept:
        for tensor in _tensors_in(outputs):
            pack(tensor)


def relative_errors(estimated: dict[str, int], measured: dict[str, int]) -> dict[str, float | None]:
    """(measured - estimated) / estimated per term; None where the estimate is zero."""
    return {
        term: (measured[term] - estimated[term]) / estimated[term] if estimated[term] else None
        for term in TERMS
    }


def host_relative_errors(
    host: Mapping[str, float], measured_terms: Mapping[str, float], measured_residual: Mapping[str, float]
) -> dict[str, float | None]:
    """(measured - estimated) / estimated of each host line (Estimate.host) and of their ``total``.

    A host line is measured under its own name: an offloaded term (``params``, ``grads``,
    ``optimizer``) as the ledger's term, which offload leaves empty on the device, and one
    of DeepSpeed's host buffers as the residual line of that name (missing: 0). Any unit,
    the same on both sides (summary.json's GB with the ``_gb`` suffix removed, or bytes).
    """
    measured = {
        name: measured_terms[name] if name in TERMS else measured_residual.get(name, 0) for name in host
    }
    errors: dict[str, float | None] = {
        name: (measured[name] - host[name]) / host[name] if host[name] else None for name in host
    }
    total = sum(host.values())
    errors["total"] = (sum(measured.values()) - total) / total if total else None
    return errors


__all__ = [
    "TERMS",
    "Estimate",
    "Ledger",
    "RankBatch",
    "boundary_estimate",
    "deepspeed_estimate",
    "fullest_device",
    "host_relative_errors",
    "measure_model_states",
    "relative_errors",
    "saved_activations",
]
