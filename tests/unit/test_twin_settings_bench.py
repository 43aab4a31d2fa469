"""bench/policy_sweep.py's setting twins (bench/attention_fold.py, bench/attention_lengths.py): a twin's steps run with
the module setting changed, then restore it whatever happens."""

from __future__ import annotations

import pytest

from bench.policy_sweep import step_with_setting
from engine.models import llama


class _Engine:
    def __init__(self, setting: str) -> None:
        self.setting = setting
        self.seen: list[bool] = []

    def step(self):
        self.seen.append(getattr(llama, self.setting))
        raise RuntimeError("a step that fails still leaves the setting restored")


@pytest.mark.parametrize("setting", ["FOLD_SHORT_RUNS", "EXACT_SHORT_RUNS"])
def test_a_twins_steps_run_with_the_setting_changed_and_leave_it_restored(setting: str) -> None:
    engine = _Engine(setting)
    default = getattr(llama, setting)
    step_with_setting(engine, "setting_twin", llama, setting, False, True)
    with pytest.raises(RuntimeError):
        engine.step()
    assert engine.seen == [False] and getattr(llama, setting) is default
    engine.setting_twin = False  # its policy moved on to another engine
    with pytest.raises(RuntimeError):
        engine.step()
    assert engine.seen[-1] is True and getattr(llama, setting) is default
