"""The learner on the real policy model: an update moves the weights the right way,
checkpoints round-trip, sync weights hold the tied head too, DeepSpeed ZeRO 1/2 step.

Optimizer steps over the 135M-parameter model take 5-15 s on this shared 2-core CPU, so
the tests that step are marked ``slow``."""

import json
import math

import pytest
import torch
from safetensors import safe_open

from rl.grpo import GRPOLossConfig, TrainSample
from rl.learner import Learner, LearnerConfig, LearnerError


def _samples(learner, advantages=(1.0, -1.0)):
    tok = learner.tokenizer
    prompt = tok("What is 2 + 2?")["input_ids"]
    good = tok(" The answer is 4.")["input_ids"]
    bad = tok(" Seven.")["input_ids"]
    probe = [TrainSample(prompt, c, [0.0] * len(c), 0.0) for c in (good, bad)]
    old = learner.log_probs(probe)  # on-policy: the engine's log-probs equal the learner's
    return [TrainSample(prompt, good, old[0], advantages[0]),
            TrainSample(prompt, bad, old[1], advantages[1])]


@pytest.fixture(scope="module")
def learner(model_path):
    torch.manual_seed(0)
    return Learner(model_path, LearnerConfig(lr=1e-5, micro_batch_size=1))


def _params(learner):
    return {k: v.detach().clone() for k, v in learner.model.named_parameters()}


@pytest.mark.slow
def test_update_raises_logprob_of_positive_advantage_sequence(learner):
    samples = _samples(learner)
    before = _params(learner)
    loss_before = learner.loss(samples)
    lp_before = learner.log_probs(samples)
    stats = learner.step(samples)
    assert learner.version == 1
    assert stats["num_seqs"] == 2 and stats["num_loss_tokens"] == sum(
        len(s.completion_ids) for s in samples)
    assert stats["num_tokens"] == sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    assert stats["loss"] == pytest.approx(loss_before, abs=1e-5)  # same batch, same weights
    assert any(not torch.equal(before[k], v) for k, v in learner.model.named_parameters())
    assert learner.loss(samples) < loss_before
    lp_after = learner.log_probs(samples)
    assert sum(lp_after[0]) > sum(lp_before[0])  # advantage +1: more likely
    assert sum(lp_after[1]) < sum(lp_before[1])  # advantage -1: less likely


@pytest.mark.slow
def test_checkpoint_round_trip_restores_model_optimizer_and_caller_state(learner, model_path,
                                                                         tmp_path):
    learner.step(_samples(learner))
    extra = {"sampler": {"num_groups": 7, "rng": {"state": 2**100}}, "ledger": {"a": 1}}
    learner.save_checkpoint(tmp_path / "ckpt", extra)
    learner.save_checkpoint(tmp_path / "ckpt", extra)  # replacing an existing one works
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temp folders left

    other = Learner(model_path, LearnerConfig(lr=1e-5, micro_batch_size=1))
    assert json.loads(json.dumps(other.load_checkpoint(tmp_path / "ckpt"))) == extra
    assert other.version == learner.version
    for k, v in learner.model.named_parameters():
        assert torch.equal(v, dict(other.model.named_parameters())[k]), k
    # the optimizer state came back too: the next step is identical
    batch = _samples(learner)
    learner.step(batch)
    other.step(batch)
    for k, v in learner.model.named_parameters():
        assert torch.allclose(v, dict(other.model.named_parameters())[k], atol=1e-7), k


def test_load_checkpoint_from_empty_folder_is_an_error(learner, tmp_path):
    with pytest.raises(LearnerError, match="no checkpoint"):
        learner.load_checkpoint(tmp_path)


def test_sync_weights_hold_every_parameter_name_the_engine_loads_tied_head_included(learner, tmp_path):
    # vLLM's reload_weights does not re-tie lm_head to the embeddings: a file without
    # lm_head.weight left the engine on the startup output head (1.23 nats off).
    expected = {n for n, _ in learner.model.named_parameters(remove_duplicate=False)}
    assert "lm_head.weight" in expected  # the tied alias is a parameter name of its own
    assert set(learner.weights_for_sync()) == expected
    assert set(learner.weights_for_sync(to_cpu=False)) == expected  # the NCCL path
    folder = learner.save_weights(tmp_path / "w")
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert f.metadata()["policy_version"] == str(learner.version)
        head, emb = f.get_tensor("lm_head.weight"), f.get_tensor("model.embed_tokens.weight")
    assert keys == expected
    assert torch.equal(head, emb)  # tied: the head is the embedding


def test_learner_config_rejects_bad_options():
    with pytest.raises(LearnerError, match="backend"):
        LearnerConfig(backend="jax")
    with pytest.raises(LearnerError, match="zero_stage"):
        LearnerConfig(backend="deepspeed", zero_stage=3)
    with pytest.raises(LearnerError, match=r"^learner\.lr=-1.0: give a learning rate > 0"):
        LearnerConfig(lr=-1.0)  # names the one option that is wrong
    with pytest.raises(LearnerError, match=r"^learner\.micro_batch_size=0: "):
        LearnerConfig(micro_batch_size=0)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2])
def test_deepspeed_zero_step_on_cpu_changes_weights(model_path, stage, monkeypatch, tmp_path):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    cfg = LearnerConfig(backend="deepspeed", zero_stage=stage, lr=1e-5, micro_batch_size=1,
                        loss=GRPOLossConfig())
    learner = Learner(model_path, cfg)
    samples = _samples(learner)
    before = _params(learner)
    loss_before = learner.loss(samples)
    stats = learner.step(samples)
    assert learner.version == 1 and stats["num_seqs"] == 2
    assert any(not torch.equal(before[k], v) for k, v in learner.model.named_parameters())
    assert learner.loss(samples) < loss_before
    learner.save_checkpoint(tmp_path / "ckpt", {"k": stage})
    assert learner.load_checkpoint(tmp_path / "ckpt") == {"k": stage}


def test_learner_gpus_must_be_distinct_positions():
    from rl.learner import learner_config

    assert LearnerConfig(gpus=[6, 7]).gpus == [6, 7]
    for bad in ([6, 6], [-1], ["6"], "6,7", [True]):
        with pytest.raises(LearnerError, match="learner.gpus"):
            LearnerConfig(gpus=bad)
    tcfg = {"learner": {"backend": "deepspeed", "zero_stage": 2, "gpus": (6, 7)},
            "loss": {"eps_low": 0.2}}
    assert learner_config(tcfg).gpus == [6, 7]


def test_cuda_device_without_a_gpu_is_refused_with_the_key():
    from rl.learner import _resolve_device

    assert _resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(LearnerError, match="learner.device=cuda"):
            _resolve_device("cuda")


@pytest.mark.slow
def test_step_reports_mismatch_only_on_samples_of_its_own_version(learner):
    # On-policy old log-probs (what an engine in sync returns): mismatch ~0. The same
    # samples with old log-probs 0.05 nats lower: |d| = 0.05 and k3 = e^0.05 - 1.05.
    # A sample stamped with another policy version is left out of the mismatch.
    samples = _samples(learner)
    v = learner.version
    for s in samples:
        s.policy_version = v
    stats = learner.step(samples)
    assert stats["mismatch/tokens"] == sum(len(s.completion_ids) for s in samples)
    assert stats["mismatch/logprob_abs_diff"] < 1e-4
    assert stats["mismatch/k3_kl"] < 1e-6
    shifted = _samples(learner)
    for s in shifted:
        s.old_logprobs = [x - 0.05 for x in s.old_logprobs]
        s.policy_version = learner.version
    shifted[1].policy_version = learner.version - 1  # stale: not measured
    stats = learner.step(shifted)
    assert stats["mismatch/tokens"] == len(shifted[0].completion_ids)
    assert stats["mismatch/logprob_abs_diff"] == pytest.approx(0.05, abs=1e-4)
    assert stats["mismatch/k3_kl"] == pytest.approx(math.exp(0.05) - 1.05, rel=1e-2)


@pytest.mark.slow
def test_an_aborted_step_stops_before_its_next_micro_batch_and_updates_nothing(learner):
    """abort_step from another thread: the running step raises StepAborted at its next
    micro-batch with nothing updated (weights, gradients, version); an abort with no step
    running does nothing, and the next step trains as usual."""
    import threading

    from rl.learner import StepAborted

    samples = _samples(learner) * 4  # 8 micro-batches of one sequence
    before, version = _params(learner), learner.version
    calls = []
    forward = learner._batch_loss

    def counting(*args, **kwargs):  # abort from another thread during the second micro-batch
        calls.append(1)
        if len(calls) == 2:
            t = threading.Thread(target=learner.abort_step)
            t.start()
            t.join()
        return forward(*args, **kwargs)

    learner._batch_loss = counting
    try:
        with pytest.raises(StepAborted, match="after 2 of 8 micro-batches"):
            learner.step(samples)
    finally:
        del learner._batch_loss
    assert learner.version == version and len(calls) == 2
    assert all(torch.equal(before[k], v) for k, v in _params(learner).items())
    assert all(p.grad is None for p in learner.model.parameters())
    learner.abort_step()  # no step running: the next one is not aborted
    assert learner.step(_samples(learner))["num_seqs"] == 2 and learner.version == version + 1
