"""The trainer's Protocols (rl/interfaces.py, rollout/weight_sync.py) match the classes the
job builds: same methods, same parameter names, so one call serves each implementation."""

import inspect

import pytest

from rl.interfaces import Learner
from rl.learner import Learner as TorchLearner
from rl.sharded_learner import ShardedLearner
from rollout.weight_sync import HttpReloadSync, NcclWeightSync, WeightSource, WeightSync


def _methods(protocol) -> list[str]:
    return [name for name, v in vars(protocol).items() if callable(v) and not name.startswith("_")]


def _params(fn) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


@pytest.mark.parametrize("impl", [HttpReloadSync, NcclWeightSync])
def test_both_weight_syncs_have_the_one_sync_signature(impl):
    for name in _methods(WeightSync):
        assert _params(getattr(impl, name)) == _params(getattr(WeightSync, name)), name


@pytest.mark.parametrize("impl", [TorchLearner, ShardedLearner])
def test_learners_implement_what_the_trainer_and_the_sync_call(impl):
    names = _methods(Learner) + _methods(WeightSource)
    assert set(names) >= {"step", "save_checkpoint", "load_checkpoint", "save_weights", "weights_for_sync"}
    for name in names:
        protocol_fn = getattr(Learner, name)
        assert _params(getattr(impl, name)) == _params(protocol_fn), name
