"""Train one experiment: ``python train.py [group=option ...] [key=value ...]``.

Hydra composes conf/ into a config validated by the schemas in runner/config.py; this
file converts it once into the frozen TrainConfig and hands it to the runner. With
``-m`` the same command runs a sweep (locally, or on SLURM with hydra/launcher=slurm).
"""

from __future__ import annotations

import datetime
import os
import shlex
import sys
import time
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from launchers import hydra_files, local_sweep, plan_exit
from launchers.compose import register_configs, to_train_config
from launchers.help import help_text
from launchers.overrides import command_overrides, override_problems
from launchers.run import NothingToTrain, RunFailed, RunInterrupted, run
from launchers.worker import exit_now
from runner.environment import DistributedEnv, from_environment, shared_run_dir, take_local_rank_argument
from runner.errors import ConfigError
from runner.exit_codes import ExitCode
from runner.layout import LayoutError
from runner.rundir import checkpoint_record
from runner.rundir.identity import RunIdentity
from runner.rundir.plan_record import PlanRecord
from runner.train.preemption import Preempted

register_configs()

# A rank other than 0 that refuses waits this long for rank 0, which refuses alike, to say why.
REFUSAL_WAIT_S = 15.0


def _identity(run_dir: Path) -> RunIdentity:
    hydra_cfg = HydraConfig.get()
    name = ",".join(hydra_cfg.overrides.task) or "default"
    group = None
    if hydra_cfg.mode == RunMode.MULTIRUN:
        group = Path(hydra_cfg.sweep.dir).name
    return RunIdentity.for_run_dir(run_dir, name=name, group=group)


def _unused_launcher(cfg: DictConfig) -> str | None:
    """hydra/launcher=slurm without ``-m``: Hydra hands only a sweep to its launcher, so the run
    would train on this host instead of being submitted."""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.RUN or hydra_cfg.runtime.choices.get("hydra/launcher") != "slurm":
        return None
    if cfg.get("plan") or cfg.get("planner", {}).get("recommend"):
        return None  # sizing it for the cluster, nothing launched
    # A sweep has its own directory (hydra.sweep.dir) and mode: the run's own settings of them stay out.
    kept = [o for o in hydra_cfg.overrides.hydra if not o.startswith(("hydra.mode=", "hydra.run."))]
    command = shlex.join(["python", "train.py", "-m", *kept, *hydra_cfg.overrides.task])
    return (
        "hydra/launcher=slurm: Hydra hands a job to its launcher only in a sweep, so this would train "
        f"on this host, not on SLURM; add -m to submit it as a sweep of one: {command}"
    )


def _refuse_unused_launcher(cfg: DictConfig, launched: DistributedEnv | None) -> None:
    """Raise the refusal of a SLURM launcher Hydra would not use (see _unused_launcher); a rank of
    torchrun or srun was launched already."""
    if launched is None and (unused := _unused_launcher(cfg)) is not None:
        raise ConfigError(unused)


def _as_list(error: Exception) -> str:
    """A refusal as the list of problems ConfigError writes: a lone LayoutError gets its bullet."""
    text = str(error)
    return text if text.startswith("  - ") else f"  - {text}"


def _refused(error: Exception, *, run_dir: Path, sweep_dir: Path | None, lead: bool) -> NoReturn:
    """A refusal before launch: rank 0 says why; a resumed run's .hydra/ goes back as it was, and
    a directory this run made for nothing goes (launchers/hydra_files.py); exit 2."""
    if lead:  # under torchrun or srun every rank refuses alike; rank 0 says why
        print(f"ladder: refused before launch:\n{_as_list(error)}", file=sys.stderr)
    if lead and hydra_files.put_back(run_dir):
        print(f"  ({run_dir}/.hydra holds the config of its last run again)", file=sys.stderr)
    elif lead and hydra_files.remove_refused_run_dir(run_dir) and sweep_dir is not None:
        hydra_files.remove_refused_sweep_dir(sweep_dir)  # no cell of it ran: the sweep's too
    if not lead:  # its launcher would stop rank 0 at this exit, before rank 0 said why
        time.sleep(REFUSAL_WAIT_S)
    sys.exit(ExitCode.REFUSED)


def _interrupted_before_launch(run_dir: Path, *, lead: bool) -> NoReturn:
    """Ctrl-C while validating or planning: a resumed run's .hydra/ goes back; exit 130."""
    print("\nladder: interrupted before any rank started; nothing trained", file=sys.stderr)
    if lead:
        hydra_files.put_back(run_dir)
    sys.exit(ExitCode.CTRL_C_AT_COMMAND)


def _say_how_to_continue(stopped: Preempted, run_dir: Path) -> None:
    """Rank 0 of torchrun, stopped at a signal after a checkpoint: the command that continues it."""
    print(f"ladder: run stopped: {stopped}", file=sys.stderr)
    print(
        "  continue with: the same torchrun (or deepspeed) command, ending in "
        f"train.resume=required hydra.run.dir={run_dir}",
        file=sys.stderr,
    )


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Compose -> typed config -> runner; returns the final loss (the sweep's objective)."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    sweep_dir = Path(hydra_cfg.sweep.dir) if hydra_cfg.mode == RunMode.MULTIRUN else None
    launched = from_environment(os.environ)
    lead = launched is None or launched.rank == 0
    ran = True  # False: this attempt trained nothing, and the run's own .hydra/ stays its record
    try:
        _refuse_unused_launcher(cfg, launched)
        outcome = run(
            to_train_config(cfg),
            run_dir=run_dir,
            identity=_identity(run_dir),
            experiment=hydra_cfg.runtime.choices.get("experiment"),
            given=list(hydra_cfg.overrides.task),
        )
        if isinstance(outcome, PlanRecord):
            if cfg.plan or cfg.planner.recommend:  # its verdict becomes the exit status, once Hydra is done
                assert outcome.exit_code is not None  # plan=true's job records it
                cell = hydra_cfg.job.num if sweep_dir else None
                plan_exit.note(cell, hydra_cfg.overrides.task, ExitCode(outcome.exit_code))
            return None
        summary = outcome
    except (ConfigError, LayoutError) as error:
        ran = False
        _refused(error, run_dir=run_dir, sweep_dir=sweep_dir, lead=lead)
    except KeyboardInterrupt:  # Ctrl-C while validating or planning: no rank had started
        ran = False
        _interrupted_before_launch(run_dir, lead=lead)
    except NothingToTrain as done:  # resumed, already finished: the run stays as it was, .hydra/ too
        ran = False
        print(f"ladder: {run_dir}: {done}", file=sys.stderr)
        if lead:
            hydra_files.put_back(run_dir)
        summary = done.summary
    except RunFailed as error:
        print(f"ladder: run failed: {error}", file=sys.stderr)
        if sweep_dir is not None and launched is None:
            raise  # a cell of a sweep on this host: recorded as failed, and the next cell runs
        sys.exit(ExitCode.FAILED)
    except Preempted as stopped:  # a rank of torchrun or srun, stopped at a signal after a checkpoint
        if launched is not None and launched.rank == 0 and launched.source == "torchrun":
            _say_how_to_continue(stopped, run_dir)
        raise
    except RunInterrupted as error:
        print(f"ladder: run stopped: {error}", file=sys.stderr)
        print(f"  continue with: {continue_command(sys.argv, run_dir, sweep_dir)}", file=sys.stderr)
        sys.exit(ExitCode.STOPPED_RESUMABLE)
    finally:
        if lead and ran:  # this attempt ran: its config is the run's record
            hydra_files.attempt_ran(run_dir, sweep_dir)
    loss = (summary.final or {}).get("loss")
    return float(loss) if loss is not None else None


def continue_command(argv: list[str], run_dir: Path, sweep_dir: Path | None) -> str:
    """The command that continues a stopped run (or, with -m, its sweep) where it was saved.

    A run with a checkpoint continues with train.resume=required: a mistyped directory is refused,
    not trained from step 0. A run stopped before its first checkpoint (killed at a second Ctrl-C,
    say) has none to require: it continues with train.resume=auto, which starts it over in the same
    directory. So does a sweep, whose cells that never started, or saved nothing, start at step 0.
    """
    dir_key = "hydra.run.dir" if sweep_dir is None else "hydra.sweep.dir"
    kept = [arg for arg in argv[1:] if not arg.startswith(("train.resume=", f"{dir_key}="))]
    where = run_dir if sweep_dir is None else sweep_dir
    saved = sweep_dir is None and checkpoint_record.latest(run_dir) is not None
    resume = "train.resume=required" if saved else "train.resume=auto"
    return shlex.join(["python", argv[0], *kept, resume, f"{dir_key}={where}"])


def _refuse(problems: list[str]) -> NoReturn:
    """Refuse the command line before Hydra composes (rank 0 says why, as in main), exit 2."""
    launched = from_environment(os.environ)
    if launched is None or launched.rank == 0:
        print("ladder: refused before launch:", *(f"  - {p}" for p in problems), sep="\n", file=sys.stderr)
    else:
        time.sleep(REFUSAL_WAIT_S)
    sys.exit(ExitCode.REFUSED)


def _before_hydra(argv: list[str]) -> None:
    """Refuse an unknown key or option, or a value its key cannot take, naming the closest valid
    ones; answer --help with every key's meaning. Nothing is composed or written yet."""
    problems = override_problems(argv[1:])
    if problems:
        _refuse(problems)
    if "--help" in argv[1:] or "-h" in argv[1:]:
        print(help_text(command_overrides(argv[1:])))
        sys.exit(ExitCode.OK)


def _agree_on_run_dir(argv: list[str]) -> None:
    """Ranks started by torchrun or srun must share one run directory: name it alike in each."""
    if any(arg.startswith("hydra.run.dir=") for arg in argv) or "-m" in argv or "--multirun" in argv:
        return
    shared = shared_run_dir(os.environ, today=datetime.date.today().isoformat())
    if shared is not None:
        argv.append(f"hydra.run.dir={shared}")


if __name__ == "__main__":
    take_local_rank_argument(sys.argv, os.environ)
    _before_hydra(sys.argv)
    _agree_on_run_dir(sys.argv)
    try:
        main()
    except Preempted:  # stopped at SLURM's signal after a checkpoint (runner/train/preemption.py)
        exit_now(ExitCode.STOPPED_RESUMABLE)
    if local_sweep.FAILED_CELLS:  # a sweep on this host ran every cell; some failed (named above)
        sys.exit(ExitCode.FAILED)
    if (verdict := plan_exit.summary()) is not None:  # plans: 3 does not fit, 4 contract not met
        print(verdict, file=sys.stderr)
    if from_environment(os.environ) is not None:
        # One rank of torchrun or srun: skip teardown destructors that may abort (see
        # launchers.worker.exit_now); everything is written by now.
        exit_now(plan_exit.exit_code())
    sys.exit(plan_exit.exit_code())
