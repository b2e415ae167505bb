"""An online wandb run needs credentials for its server before any rank starts.

Rank 0's ``wandb.init`` looks for them (``WANDB_API_KEY``, ``WANDB_IDENTITY_TOKEN_FILE``, the
``.netrc`` entry ``wandb login`` writes, wandb's settings file) and, with no terminal to ask
on, raises ``UsageError: No API key configured``: the ranks would have started, imported
torch and built the engine, and the run would end there. The launching process asks wandb's
own lookup the same question first, without a prompt and without the network
(``wandb.sdk.lib.wbauth``; a wandb without that module leaves the check to ``wandb.init``).
"""

from __future__ import annotations

import os

from runner.config import LoggerConfig, WandbMode

# wandb's default server (wandb/env.py BASE_URL's fallback).
WANDB_CLOUD = "https://api.wandb.ai"


def wandb_host(logger: LoggerConfig) -> str:
    """The server the run's wandb logs to: ``logger.base_url``, else WANDB_BASE_URL, else wandb's cloud."""
    return logger.base_url or os.environ.get("WANDB_BASE_URL") or WANDB_CLOUD


def credentials_problems(logger: LoggerConfig) -> list[str]:
    """Why an online wandb run could not log in (empty when it can, or when it logs offline)."""
    if logger.name != "wandb" or logger.mode != WandbMode.online:
        return []
    try:
        # Deferred: wandb is imported only by a run that logs to it (seconds of start-up).
        from wandb.sdk.lib.wbauth.authenticate import authenticate_session
    except ImportError:  # a wandb without it: wandb.init decides
        return []
    host = wandb_host(logger)
    offline = "or log offline (logger.mode=offline) and `wandb sync` the run's wandb/ folder later"
    try:
        found = authenticate_session(host=host, source="ladder", prompt=False, update_session=False)
    except Exception as error:  # wandb's AuthenticationError (a key of the wrong form), its settings' own
        said = " ".join(str(error).split()).rstrip(".")
        return [f"logger.mode=online: wandb cannot log in to {host} ({said}): mend that, {offline}"]
    if found is None:
        login = "wandb login" if host == WANDB_CLOUD else f"wandb login --host {host}"
        return [
            f"logger.mode=online: wandb has no API key for {host} (WANDB_API_KEY, or the ~/.netrc entry "
            f"`{login}` writes); run `{login}` or set WANDB_API_KEY, {offline}"
        ]
    return []
