"""Telling a full filesystem's errors from others, through the errors raised from or during them."""

from __future__ import annotations

import errno

import pytest

from runner.rundir.disk_room import continue_words, out_of_room

pytestmark = pytest.mark.unit


def _raised_during(first: BaseException, then: BaseException) -> BaseException:
    try:
        try:
            raise first
        except BaseException:
            raise then  # noqa: B904 -- "during handling": the context, not the cause
    except BaseException as error:
        return error


def test_a_write_without_room_is_found_under_the_errors_it_led_to():
    full = OSError(errno.ENOSPC, "No space left on device")
    quota = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert out_of_room(full) and out_of_room(quota)
    assert out_of_room(_raised_during(full, RuntimeError("unexpected pos 128 vs 0")))
    assert not out_of_room(OSError(errno.EACCES, "Permission denied"))
    assert not out_of_room(RuntimeError("unrelated")) and not out_of_room(None)


def test_the_words_name_the_checkpoint_a_run_continues_from(tmp_path):
    assert continue_words(tmp_path) == "the run has no checkpoint to continue from"
    (tmp_path / "checkpoints" / "step_00000004").mkdir(parents=True)
    (tmp_path / "checkpoints" / "latest.json").write_text('{"tag": "step_00000004", "completed_steps": 4}')
    words = "train.resume=auto continues the run from step_00000004 once there is room"
    assert continue_words(tmp_path) == words
    assert continue_words(tmp_path, needs_room=False).endswith("from step_00000004")
