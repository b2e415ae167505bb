"""Entry point of one rank started by the local launcher: ``python -m launchers.worker RUN_DIR``.

It reads what the launching process decided and wrote (the composed config in
``.hydra/config.yaml`` and ``deepspeed_config.json``), so every rank runs exactly that.
A rank that fails leaves ``failure_rank<N>.json`` with its error for the launcher.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

from launchers.environment import from_environment
from runner.identity import RunIdentity
from runner.run_files import load_run, write_failure


def main(argv: list[str]) -> int:
    """Run this process's rank; exit non-zero on failure."""
    run_dir = Path(argv[1])
    env = from_environment(os.environ)
    if env is None:
        print("launchers.worker needs RANK and WORLD_SIZE (it is started by the local launcher)")
        return 2
    try:
        config, layout, ds_config = load_run(run_dir)
        from runner.rank import run_rank

        run_rank(
            config,
            layout=layout,
            ds_config=ds_config,
            run_dir=run_dir,
            env=env,
            identity=RunIdentity.from_env(run_dir),
        )
    except BaseException as error:
        write_failure(run_dir, rank=env.rank, error=error, trace=traceback.format_exc())
        traceback.print_exc()
        return 1
    return 0


def exit_now(code: int) -> None:
    """Flush and leave without interpreter teardown.

    Every file is written and the process group destroyed by then; what is left are
    destructors of gloo and DeepSpeed's communication ops, which abort now and then at
    interpreter exit ("terminate called without an active exception", SIGABRT) and would
    turn a finished rank into a failed one.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main(sys.argv))
