"""Which piece of each sample's sequence a model runs: its rank in a sequence-parallel group
(runner/parallel/sequence.py makes the group and sets it on the model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class SequenceShard:
    """This rank's place in its sequence-parallel group: the group, its rank in it, and its size."""

    group: Any  # torch.distributed.ProcessGroup
    rank: int
    size: int

    def length(self, full: int) -> int:
        """Tokens this rank holds of a sample of ``full`` tokens."""
        return full // self.size

    def first_position(self, full: int) -> int:
        """The position in the sample of this rank's first token, of a sample of ``full`` tokens."""
        return self.rank * self.length(full)

    def piece(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's piece of the sequence dimension (dim 1) of a (B, T, ...) tensor."""
        length, first = self.length(tensor.shape[1]), self.first_position(tensor.shape[1])
        return tensor[:, first : first + length]
