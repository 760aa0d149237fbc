"""The sharded learner (rl/sharded_learner.py, FSDP2) on 2 gloo ranks against the
one-process learner, on a tiny Llama (2 layers, hidden 64, vocab 512, tied embeddings).

Ranks are separate processes started as a launcher would (RANK / WORLD_SIZE /
MASTER_ADDR / MASTER_PORT on 127.0.0.1), running tests/rl/sharded_ranks.py.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rl.distributed import RankError, rank_from_env, token_balanced_partition
from rl.grpo import TrainSample
from rl.learner import Learner, LearnerConfig

REPO = Path(__file__).resolve().parents[2]
RANK_SCRIPT = Path(__file__).with_name("sharded_ranks.py")
RANK_TIMEOUT_S = 240  # generous: other test runs load this machine


def _tiny_model(folder: Path) -> Path:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                      pad_token_id=0, eos_token_id=1, bos_token_id=1)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, 512)}}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<pad>")),
                                  pad_token="<pad>", eos_token="<eos>")
    tok.save_pretrained(folder)
    return folder


# The engine's log-probs of samples 0 and 1 are 0.05 nats above the learner's (a
# train/inference mismatch), sample 3 was generated at another policy version (left out
# of the mismatch); the others are on-policy.
ENGINE_OFFSET = {0: 0.05, 1: 0.05}
OTHER_VERSION = {3: 7}


def _samples(learner: Learner) -> list[TrainSample]:
    """5 samples of different lengths (so the 2 ranks get different counts and one runs a
    zero-weight micro-batch), with a masked-out span, engine log-probs as above."""
    g = torch.Generator().manual_seed(1)
    raw = []
    for i, (p, c) in enumerate([(5, 9), (3, 4), (7, 12), (4, 6), (6, 3)]):
        ids = torch.randint(2, 512, (p + c,), generator=g).tolist()
        mask = [1] * c if i != 2 else [1] * 4 + [0] * 3 + [1] * 5
        raw.append(TrainSample(ids[:p], ids[p:], [0.0] * c, 0.0, loss_mask=mask))
    old = learner.log_probs(raw)
    adv = [1.0, -0.5, 0.8, -1.2, 0.3]
    return [TrainSample(s.prompt_ids, s.completion_ids, [x + ENGINE_OFFSET.get(i, 0.0) for x in lp],
                        a, loss_mask=s.loss_mask, policy_version=OTHER_VERSION.get(i))
            for i, (s, lp, a) in enumerate(zip(raw, old, adv))]


def _launch(n: int, scenario: str, work: Path, model: Path) -> list[subprocess.Popen]:
    from common.process import free_port

    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port("127.0.0.1")),
           "WORLD_SIZE": str(n), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return [subprocess.Popen([sys.executable, str(RANK_SCRIPT), scenario, str(work), str(model)],
                             env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for r in range(n)]


def _wait(procs: list[subprocess.Popen], timeout_s: float = RANK_TIMEOUT_S) -> list[tuple[int, str]]:
    out = []
    try:
        for p in procs:
            _, err = p.communicate(timeout=timeout_s)
            out.append((p.returncode, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def _run(n: int, scenario: str, work: Path, model: Path) -> None:
    for r, (rc, err) in enumerate(_wait(_launch(n, scenario, work, model))):
        log = work / f"rank{r}.log"
        assert rc == 0, f"rank {r} exited {rc}: {err[-3000:]} {log.read_text()[-3000:] if log.exists() else ''}"


def _folder_weights(folder: Path) -> dict[str, torch.Tensor]:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    out: dict[str, torch.Tensor] = {}
    for f in sorted(set(index["weight_map"].values())):
        out.update(load_file(str(folder / f)))
    assert set(out) == set(index["weight_map"])
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One 2-rank run (sync at version 0, one step, sync, checkpoint), and the one-process
    learner's step on the same batch."""
    work = tmp_path_factory.mktemp("sharded")
    model = _tiny_model(work / "model")
    ref = Learner(model, LearnerConfig(device="cpu", lr=1e-3, micro_batch_size=2))
    initial = {k: v.clone() for k, v in ref.model.state_dict().items()}
    samples = _samples(ref)
    (work / "samples.pkl").write_bytes(pickle.dumps(samples))
    ref_logp = ref.log_probs(samples)
    ref_loss = ref.loss(samples)
    ref_stats = ref.step(samples)
    _run(2, "train", work, model)
    return {"work": work, "model": model, "initial": initial, "ref_stats": ref_stats,
            "ref_logp": ref_logp, "ref_loss": ref_loss, "ref_weights": ref.model.state_dict(),
            "samples": samples,
            **json.loads((work / "stats.json").read_text())}


def test_two_ranks_take_the_one_rank_step(trained):
    # fp32 on CPU: the same sums in another order differ by a few ulp; 1e-5 relative is
    # far above that and far below any normalisation error (a factor of 2 or 5/3).
    s, ref = trained["step"], trained["ref_stats"]
    assert s["ranks"] == 2 and s["num_seqs"] == 5 and s["num_loss_tokens"] == ref["num_loss_tokens"]
    assert s["loss"] == pytest.approx(ref["loss"], rel=1e-5)
    assert s["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5)
    assert s["clip_frac"] == pytest.approx(ref["clip_frac"], abs=1e-6)
    for a, b in zip(trained["log_probs"], trained["ref_logp"]):
        assert a == pytest.approx(b, abs=1e-5)
    # After AdamW (lr 1e-3): where a gradient is near Adam's eps (1e-8), m / (sqrt(v) + eps)
    # magnifies those ulps, so the weights agree to 1% of one step (1e-5), not to 1e-6.
    w1 = _folder_weights(trained["work"] / "w1")
    for k, v in trained["ref_weights"].items():
        torch.testing.assert_close(w1[k], v, rtol=1e-5, atol=1e-5)


def test_two_ranks_compute_the_one_rank_loss_without_an_update(trained):
    # loss() before the step, on the weights both learners started from
    assert trained["loss"] == pytest.approx(trained["ref_loss"], rel=1e-5)
    assert trained["loss"] == pytest.approx(trained["step"]["loss"], rel=1e-5)  # same forward


def test_disk_estimate_of_the_sharded_model_is_the_whole_models(trained):
    # rl.train prints it at start for either learner: global sizes, not one rank's shards
    ref = Learner(trained["model"], LearnerConfig(device="cpu")).disk_estimate(2)
    assert trained["disk"] == vars(ref)


def test_two_ranks_report_the_one_rank_train_inference_mismatch(trained):
    s, ref = trained["step"], trained["ref_stats"]
    # tokens of the samples of this version (all but sample 3), loss mask applied
    current = [x for i, x in enumerate(trained["samples"]) if i not in OTHER_VERSION]
    assert s["mismatch/tokens"] == ref["mismatch/tokens"] == sum(sum(x.loss_mask) for x in current)
    assert s["mismatch/logprob_abs_diff"] == pytest.approx(ref["mismatch/logprob_abs_diff"], rel=1e-5)
    assert s["mismatch/k3_kl"] == pytest.approx(ref["mismatch/k3_kl"], rel=1e-4)
    # by hand: samples 0 and 1 are 0.05 nats off on their 9 + 4 tokens, the rest on-policy
    n = s["mismatch/tokens"]
    assert s["mismatch/logprob_abs_diff"] == pytest.approx(0.05 * 13 / n, abs=1e-5)
    assert s["mismatch/k3_kl"] == pytest.approx((math.exp(-0.05) + 0.05 - 1) * 13 / n, rel=1e-2)


def test_ranks_get_balanced_tokens_and_half_the_optimizer_state_each(trained):
    s = trained["step"]
    # lengths 14, 7, 19, 10, 9 -> LPT: {19, 9}=28 and {14, 10, 7}=31
    assert (s["rank_tokens_min"], s["rank_tokens_max"]) == (28.0, 31.0)
    per_rank = [s["optimizer_state_mib_rank0"], s["optimizer_state_mib_rank1"]]
    n_params = sum(v.numel() for k, v in trained["initial"].items() if k != "lm_head.weight")
    full_mib = 2 * 4 * n_params / 2**20  # exp_avg + exp_avg_sq in fp32 (+ tiny step counters)
    assert sum(per_rank) == pytest.approx(full_mib, rel=0.01)
    for mib in per_rank:
        assert mib == pytest.approx(full_mib / 2, rel=0.05)
    assert s["peak_mem_gib_rank0"] > 0 and s["peak_mem_gib_rank1"] > 0
    assert trained["sync"]["buckets"] >= 3  # sync_bucket_mb=0.1 against a 0.4 MiB model


def test_synced_weights_are_byte_equal_to_the_full_state_dict(trained):
    work = trained["work"]
    w0 = _folder_weights(work / "w0")
    assert set(w0) == set(trained["initial"]) and "lm_head.weight" in w0
    for k, v in trained["initial"].items():
        assert torch.equal(w0[k], v), k
    full = torch.load(work / "full.pt")["model"]
    w1 = _folder_weights(work / "w1")
    assert set(w1) == set(full) | {"lm_head.weight"}
    for k in w1:
        assert torch.equal(w1[k], full.get(k, full["model.embed_tokens.weight"])), k
    assert torch.equal(w1["lm_head.weight"], w1["model.embed_tokens.weight"])


def test_streamed_weights_of_the_nccl_sync_hold_every_tensor_and_the_tied_head(trained):
    # weights_for_sync: what the NCCL broadcast sends, gathered bucket by bucket as taken.
    # The embedding (128 KiB) fills a 0.1 MiB bucket alone, so the tied head, last in the
    # state dict, is gathered again in another bucket.
    work = trained["work"]
    streamed = torch.load(work / "streamed.pt")
    w1 = _folder_weights(work / "w1")
    names = [n for n, _, _ in streamed["meta"]]
    assert names == list(streamed["tensors"]) and set(names) == set(trained["initial"])
    assert "lm_head.weight" in names
    for n, shape, dtype in streamed["meta"]:  # what the engines allocate receive buffers from
        t = streamed["tensors"][n]
        assert list(t.shape) == shape and str(t.dtype) == dtype, n
        assert torch.equal(t, w1[n]), n
    assert torch.equal(streamed["tensors"]["lm_head.weight"],
                       streamed["tensors"]["model.embed_tokens.weight"])


@pytest.mark.parametrize("ranks", [1, 2])
def test_checkpoint_of_two_ranks_resumes_on_one_and_two(trained, ranks):
    work = trained["work"]
    _run(ranks, "resume", work, trained["model"])
    saved, resumed = torch.load(work / "full.pt"), torch.load(work / f"resumed{ranks}.pt")
    assert set(saved["model"]) == set(resumed["model"])
    for k, v in saved["model"].items():
        assert torch.equal(resumed["model"][k], v), k
    so, ro = saved["optim"]["state"], resumed["optim"]["state"]
    assert set(so) == set(ro) and so
    for k in so:
        for field in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(torch.as_tensor(ro[k][field]), torch.as_tensor(so[k][field])), (k, field)
    meta = json.loads((work / f"resumed{ranks}.json").read_text())
    assert meta == {"extra": {"sampler": {"num_groups": 3}}, "version": 1}


def test_a_rank_killed_mid_step_fails_the_job_with_one_line(trained, tmp_path):
    (tmp_path / "samples.pkl").write_bytes((trained["work"] / "samples.pkl").read_bytes())
    procs = _launch(2, "steps", tmp_path, trained["model"])
    try:
        deadline = time.monotonic() + RANK_TIMEOUT_S
        while not (tmp_path / "stepping").exists():
            assert time.monotonic() < deadline and procs[0].poll() is None, "rank 0 never stepped"
            time.sleep(0.2)
        time.sleep(1.0)
        os.kill(procs[1].pid, signal.SIGKILL)
        (rc0, err0), (rc1, _) = _wait(procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert rc1 == -signal.SIGKILL and rc0 == 1
    last = err0.strip().splitlines()[-1]
    assert last.startswith("error: learner rank 1 died during step"), err0[-2000:]
    assert str(tmp_path / "rank1.log") in last


def test_under_torchrun_a_rank_killed_mid_step_is_named_in_one_line_and_nothing_runs_on(
        trained, tmp_path):
    # torchrun's agent stops the other ranks with SIGTERM as soon as one dies (before rank
    # 0 has told which): rank 0 still names the dead rank and its log in one line, and the
    # rank the agent stopped is not blamed.
    from common.process import free_port

    (tmp_path / "samples.pkl").write_bytes((trained["work"] / "samples.pkl").read_bytes())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--master-port", str(free_port("127.0.0.1")), "--log-dir", str(tmp_path / "torchrun"),
            str(RANK_SCRIPT), "steps",
            str(tmp_path), str(trained["model"])]
    agent = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + RANK_TIMEOUT_S
        while not ((tmp_path / "stepping").exists() and (tmp_path / "pid1").exists()):
            assert time.monotonic() < deadline and agent.poll() is None, "rank 0 never stepped"
            time.sleep(0.2)
        time.sleep(1.0)
        os.kill(int((tmp_path / "pid1").read_text()), signal.SIGKILL)
        out, _ = agent.communicate(timeout=RANK_TIMEOUT_S)
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
    assert agent.returncode != 0
    named = [line for line in out.splitlines() if "learner rank" in line and "during step" in line]
    assert len(named) == 1, out[-3000:]
    assert named[0].startswith("error: learner rank 1 died during step"), named
    assert str(tmp_path / "rank1.log") in named[0]
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert [line for line in ps.splitlines() if str(tmp_path) in line and "ps -eo" not in line] == []


def test_token_balanced_partition_evens_tokens_over_ranks():
    # LPT: 9 -> r0, 8 -> r1, 5 -> r1 (8 < 9), 4 -> r0, 1 -> r1 (13 = 13: fewer samples? r0 has 2,
    # r1 has 2 -> lower rank r0)
    assert token_balanced_partition([9, 8, 5, 4, 1], 2) == [[0, 3, 4], [1, 2]]
    assert token_balanced_partition([3], 2) == [[0], []]


def test_rank_from_env_refuses_a_rank_outside_the_world():
    assert rank_from_env({}).world_size == 1
    assert rank_from_env({"RANK": "1", "WORLD_SIZE": "2"}).rank == 1
    with pytest.raises(RankError, match="RANK=2 with WORLD_SIZE=2"):
        rank_from_env({"RANK": "2", "WORLD_SIZE": "2"})
