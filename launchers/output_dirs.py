"""The run and sweep directories a command names, checked before Hydra makes them.

Hydra makes ``hydra.run.dir`` (or, with ``-m``, ``hydra.sweep.dir``) before the job starts; one
it cannot make (under /proc, under a file, on a read-only filesystem, where the user may not
write) ends in Hydra's own traceback. Here such a directory is refused first, with the reason
the system gave and a fix. Nothing is left behind: the check makes one empty directory in the
nearest folder that exists and removes it at once. A value Hydra interpolates (``${now:...}``)
is Hydra's to resolve and is not checked.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

OUTPUT_DIR_KEYS = ("hydra.run.dir", "hydra.sweep.dir")


def directory_problem(key: str, value: str) -> str | None:
    """Why the directory ``key=value`` cannot be made, in one line with a fix; None if it can be."""
    if "${" in value:
        return None
    wanted = Path(value).expanduser()
    nearest = wanted
    while not nearest.exists() and nearest != nearest.parent:
        nearest = nearest.parent
    fix = f"name a directory you can write ({key}=outputs/my_run, say)"
    if not nearest.is_dir():
        return f"{key}={value}: {nearest} is a file, so no directory can be made under it; {fix}"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".ladder-check-", dir=nearest))
    except OSError as error:
        return f"{key}={value}: no directory can be made in {nearest} ({error.strerror}); {fix}"
    return None
