"""A run's identity across sinks: its name (the overrides), its group (the sweep), a stable id."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

_ENV = {"name": "LADDER_RUN_NAME", "group": "LADDER_RUN_GROUP", "run_id": "LADDER_RUN_ID"}


@dataclass(frozen=True)
class RunIdentity:
    """Name, group and id shared by wandb, summary.json and the report."""

    name: str
    group: str | None
    run_id: str

    def exports(self) -> dict[str, str]:
        """Environment variables that carry the identity to rank processes."""
        values = {"name": self.name, "group": self.group or "", "run_id": self.run_id}
        return {_ENV[key]: value for key, value in values.items()}

    @staticmethod
    def from_env(run_dir: Path) -> RunIdentity:
        """The identity a launcher exported, or one derived from the run directory."""
        default = RunIdentity.for_run_dir(run_dir, name=run_dir.name, group=None)
        return RunIdentity(
            name=os.environ.get(_ENV["name"], default.name),
            group=os.environ.get(_ENV["group"]) or None,
            run_id=os.environ.get(_ENV["run_id"], default.run_id),
        )

    @staticmethod
    def for_run_dir(run_dir: Path, *, name: str, group: str | None) -> RunIdentity:
        """A stable id from the run directory's absolute path: a resumed run keeps its wandb run."""
        digest = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:12]
        return RunIdentity(name=name or "default", group=group, run_id=f"ladder-{digest}")
