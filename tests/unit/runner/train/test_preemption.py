"""Signals noted for the training loop, the hand-back to submitit, and when a run resumes."""

from __future__ import annotations

import os
import signal
import subprocess
from types import SimpleNamespace

import pytest

from runner.config import Resume
from runner.train.preemption import NONE, REQUEUE, TERM, StopSignals, requeued, restarts, resumes

pytestmark = pytest.mark.unit


def _config(resume: Resume) -> SimpleNamespace:
    return SimpleNamespace(resume=resume)


def test_a_requeued_job_resumes_without_being_asked():
    assert restarts({}) == 0
    assert restarts({"SLURM_RESTART_COUNT": "2"}) == 2
    assert not requeued({"SLURM_RESTART_COUNT": "0"})
    assert requeued({"SLURM_RESTART_COUNT": "1"})
    assert requeued({"LADDER_RESUME": "1"})
    assert not resumes(_config(Resume.never), {})  # type: ignore[arg-type]
    assert resumes(_config(Resume.never), {"SLURM_RESTART_COUNT": "1"})  # type: ignore[arg-type]
    assert resumes(_config(Resume.auto), {})  # type: ignore[arg-type]


def test_signals_are_noted_not_acted_on_and_the_old_handlers_come_back():
    calls: list[int] = []
    old_usr2 = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    old_term = signal.getsignal(signal.SIGTERM)
    stop = StopSignals()
    try:
        assert stop.install()
        assert stop.asked == NONE
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.asked == TERM
        os.kill(os.getpid(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.asked == REQUEUE  # a requeue, once asked, is not downgraded
        assert calls == []
        stop.restore()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert calls == [signal.SIGUSR2]
        assert signal.getsignal(signal.SIGTERM) == old_term
    finally:
        stop.restore()
        signal.signal(signal.SIGUSR2, old_usr2)


def _hand_back_with(previous) -> tuple[bool, str]:
    old = signal.signal(signal.SIGUSR2, previous)
    stop = StopSignals()
    try:
        stop.install()
        return stop.hand_back()
    finally:
        stop.restore()
        signal.signal(signal.SIGUSR2, old)


def test_rank_0_hands_the_job_back_to_submitits_handler():
    def requeues(signum, frame):  # as submitit's SignalHandler.checkpoint_and_try_requeue
        raise SystemExit(-1)

    def refuses(signum, frame):
        raise RuntimeError("Job not requeued because: timed-out too many times.")

    def requeued_and_ended(signum, frame):  # scontrol requeue, itself ended by the requeue's SIGTERM
        raise subprocess.CalledProcessError(-signal.SIGTERM, ["scontrol", "requeue", "7"])

    def scontrol_fails(signum, frame):
        raise subprocess.CalledProcessError(1, ["scontrol", "requeue", "7"])

    assert _hand_back_with(requeues)[0] is True
    assert _hand_back_with(requeued_and_ended)[0] is True
    requeued_, why = _hand_back_with(scontrol_fails)
    assert not requeued_ and "returned non-zero exit status 1" in why
    requeued_, why = _hand_back_with(refuses)
    assert not requeued_ and "timed-out too many times" in why
    requeued_, why = _hand_back_with(signal.SIG_DFL)
    assert not requeued_ and "no submitit handler" in why
