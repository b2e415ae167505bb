"""An online wandb run without credentials is refused before any rank starts, saying how to log in."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from train_helpers import ROOT, run_train

pytestmark = pytest.mark.e2e

ONLINE = ("logger=wandb", "logger.mode=online", "train.steps=1")
# A key of the form wandb accepts (40 characters); nothing here sends it anywhere.
KEY = "0123456789abcdef0123456789abcdef01234567"


def _no_credentials(home: Path, **extra: str) -> dict[str, str]:
    """A user with no wandb login: an empty home, no .netrc, no key in the environment."""
    home.mkdir(exist_ok=True)
    base = {"HOME": str(home), "NETRC": str(home / ".netrc"), "WANDB_API_KEY": ""}  # "" is unset to wandb
    return {**base, "WANDB_CONFIG_DIR": str(home / ".config" / "wandb"), **extra}


def test_an_online_run_without_a_wandb_key_is_refused_before_launch(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train(*ONLINE, run_dir=run_dir, env=_no_credentials(tmp_path / "home"), timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    said = result.stderr
    refusal = "refused before launch:\n  - logger.mode=online: wandb has no API key for https://api.wandb.ai"
    assert refusal in said, said[-2000:]
    for fix in ("run `wandb login`", "WANDB_API_KEY", "logger.mode=offline", "wandb sync"):
        assert fix in said, said[-2000:]
    assert "Traceback" not in said
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "deepspeed_config.json").exists()


def test_a_key_wandb_would_reject_is_refused_with_wandbs_reason(tmp_path):
    env = _no_credentials(tmp_path / "home", WANDB_API_KEY="abc")
    result = run_train(*ONLINE, run_dir=tmp_path / "run", env=env, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    reason = "logger.mode=online: wandb cannot log in to https://api.wandb.ai (WANDB_API_KEY invalid"
    assert reason in result.stderr, result.stderr[-2000:]


# wandb caches what it read in its process: each case asks in a process of its own.
ASK = textwrap.dedent(
    """
    import sys
    from runner.config import LoggerConfig, WandbMode
    from runner.preflight.wandb_credentials import credentials_problems

    mode, base_url = sys.argv[1], sys.argv[2] or None
    print(credentials_problems(LoggerConfig(mode=WandbMode(mode), base_url=base_url)))
    """
)


def _ask(home: Path, mode: str, base_url: str = "") -> str:
    env = _no_credentials(home)
    done = subprocess.run(
        [sys.executable, "-c", ASK, mode, base_url], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_the_netrc_entry_wandb_login_writes_is_enough(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".netrc").write_text(f"machine api.wandb.ai\n  login user\n  password {KEY}\n")
    (home / ".netrc").chmod(0o600)
    assert _ask(home, "online") == "[]"
    # A self-hosted server needs its own entry, and the fix names its host.
    said = _ask(home, "online", "http://wandb.example:8080")
    assert "no API key for http://wandb.example:8080" in said
    assert "`wandb login --host http://wandb.example:8080`" in said


def test_offline_and_disabled_runs_need_no_login(tmp_path):
    for mode in ("offline", "disabled"):
        assert _ask(tmp_path / "home", mode) == "[]"
