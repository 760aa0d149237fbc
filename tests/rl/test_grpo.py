"""GRPO maths on hand-worked groups: advantages, clip-higher, Dr. GRPO, loss mask, KL,
micro-batch accumulation, batch layout and the async limits."""

import math

import pytest
import torch

from rl.grpo import (AsyncLimits, GRPOError, GRPOLossConfig, TrainSample, aggregate_loss,
                     collate, group_advantages, k3_kl, policy_loss_per_token, token_log_probs)

LN = math.log


def test_std_normalised_advantages_on_a_hand_worked_group():
    # group g: rewards 1,0,0,1 -> mean 0.5, sample std sqrt(4 * 0.25 / 3) = 0.5774
    adv = group_advantages([1, 0, 0, 1, 3.0], ["g", "g", "g", "g", "h"], eps=0.0)
    s = math.sqrt(1 / 3)
    assert adv.tolist() == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0.0])


def test_dr_grpo_advantages_are_not_divided_by_std():
    adv = group_advantages([2.0, 0.0, 1.0], ["g"] * 3, scale_by_std=False)
    assert adv.tolist() == pytest.approx([1.0, -1.0, 0.0])


def test_group_with_equal_rewards_has_zero_advantage():
    assert group_advantages([1.0, 1.0, 1.0], ["g"] * 3).tolist() == [0.0, 0.0, 0.0]


def test_interleaved_groups_are_normalised_separately():
    adv = group_advantages([1.0, 10.0, 0.0, 20.0], ["a", "b", "a", "b"], scale_by_std=False)
    assert adv.tolist() == pytest.approx([0.5, -5.0, -0.5, 5.0])


def _one_seq(ratios, adv, eps_low=0.2, eps_high=0.28):
    old = torch.full((1, len(ratios)), LN(0.5))
    new = old + torch.log(torch.tensor([ratios]))
    cfg = GRPOLossConfig(eps_low=eps_low, eps_high=eps_high)
    return policy_loss_per_token(new, old, torch.tensor([adv]), cfg)


def test_clip_higher_caps_positive_advantage_at_one_plus_eps_high():
    loss, st = _one_seq([1.0, 1.5, 0.5], adv=1.0)
    # -min(r*A, clip(r, 0.8, 1.28)*A): r=1 -> -1; r=1.5 -> -1.28 (clipped); r=0.5 -> -0.5
    assert loss[0].tolist() == pytest.approx([-1.0, -1.28, -0.5])
    assert st["clipped"][0].tolist() == [False, True, False]
    sym, _ = _one_seq([1.0, 1.5, 0.5], adv=1.0, eps_high=0.2)
    assert sym[0, 1].item() == pytest.approx(-1.2)


def test_negative_advantage_is_clipped_from_below_by_eps_low():
    loss, st = _one_seq([1.5, 0.5], adv=-1.0)
    # r=1.5: min(-1.5, -1.28) = -1.5 -> loss 1.5 (unclipped); r=0.5: min(-0.5, -0.8) -> 0.8
    assert loss[0].tolist() == pytest.approx([1.5, 0.8])
    assert st["clipped"][0].tolist() == [False, True]


def _two_seq_losses():
    # seq 0: token losses 1, 2, 3 with mask 1, 1, 0 ; seq 1: loss 4, 0, 0 mask 1, 0, 0
    per_tok = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    return per_tok, mask


def test_token_mean_counts_each_unmasked_token_once():
    per_tok, mask = _two_seq_losses()
    assert aggregate_loss(per_tok, mask, GRPOLossConfig()).item() == pytest.approx((1 + 2 + 4) / 3)


def test_seq_mean_token_mean_weights_sequences_equally():
    per_tok, mask = _two_seq_losses()
    cfg = GRPOLossConfig(loss_agg="seq_mean_token_mean")
    assert aggregate_loss(per_tok, mask, cfg).item() == pytest.approx(((1 + 2) / 2 + 4) / 2)


def test_dr_grpo_divides_by_constant_budget_not_length():
    per_tok, mask = _two_seq_losses()
    cfg = GRPOLossConfig.dr_grpo(budget_tokens=10)
    assert cfg.scale_adv_by_std is False
    assert aggregate_loss(per_tok, mask, cfg).item() == pytest.approx((1 + 2 + 4) / (2 * 10))


def test_masked_tokens_get_no_gradient():
    new = torch.zeros((1, 3), requires_grad=True)
    per_tok, _ = policy_loss_per_token(new, torch.zeros((1, 3)), torch.tensor([1.0]), GRPOLossConfig())
    aggregate_loss(per_tok, torch.tensor([[1, 0, 1]]), GRPOLossConfig()).backward()
    # d/dnew of -(exp(new - old) * A) / 2 at new = old is -A / 2 on unmasked tokens
    assert new.grad[0].tolist() == pytest.approx([-0.5, 0.0, -0.5])


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_sum_budget"])
def test_micro_batches_add_up_to_the_full_batch_loss(agg):
    per_tok, mask = _two_seq_losses()
    cfg = GRPOLossConfig(loss_agg=agg, budget_tokens=7)
    full = aggregate_loss(per_tok, mask, cfg)
    n_tok = float(mask.sum())
    parts = sum(aggregate_loss(per_tok[i:i + 1], mask[i:i + 1], cfg, 2, n_tok) for i in (0, 1))
    assert parts.item() == pytest.approx(full.item())


def test_k3_kl_on_hand_worked_values_and_in_loss():
    # d = ln .25 - ln .5 = -ln 2: exp(d) - d - 1 = 0.5 + ln 2 - 1
    kl = k3_kl(torch.tensor([LN(0.5)]), torch.tensor([LN(0.25)]))
    assert kl.item() == pytest.approx(0.5 + LN(2) - 1)
    assert k3_kl(torch.tensor([-1.0]), torch.tensor([-1.0])).item() == 0.0
    cfg = GRPOLossConfig(kl_coef=0.1)
    new = torch.tensor([[LN(0.5)]])
    loss, st = policy_loss_per_token(new, new, torch.tensor([0.0]), cfg, torch.tensor([[LN(0.25)]]))
    assert loss.item() == pytest.approx(0.1 * (0.5 + LN(2) - 1))
    with pytest.raises(GRPOError, match="ref"):
        policy_loss_per_token(new, new, torch.tensor([0.0]), cfg)


def test_collate_aligns_completion_tokens_with_predicting_positions():
    s = TrainSample([1, 2, 3], [4, 5, 6], [-0.1, -0.2, -0.3], 0.5, loss_mask=[1, 0, 1])
    t = TrainSample([7], [8], [-0.4], -1.0)
    b = collate([s, t], pad_token_id=0)
    assert b.input_ids.tolist() == [[1, 2, 3, 4, 5, 6], [7, 8, 0, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1] * 6, [1, 1, 0, 0, 0, 0]]
    # column t predicts input_ids[t + 1]: completion of s starts at column 2
    assert b.loss_mask.tolist() == [[0, 0, 1, 0, 1], [1, 0, 0, 0, 0]]
    assert b.old_logp[0].tolist() == pytest.approx([0, 0, -0.1, -0.2, -0.3])
    assert b.advantages.tolist() == [0.5, -1.0]
    assert b.slice(1, 2).input_ids.tolist() == [[7, 8]]


def test_train_sample_rejects_mismatched_lengths():
    with pytest.raises(GRPOError, match="old_logprobs"):
        TrainSample([1], [2, 3], [-0.1], 1.0)


def test_token_log_probs_reads_the_next_token():
    logits = torch.log(torch.tensor([[[0.1, 0.9], [0.6, 0.4], [0.5, 0.5]]]))
    lp = token_log_probs(logits, torch.tensor([[0, 1, 0]]))
    assert lp[0].tolist() == pytest.approx([LN(0.9), LN(0.6)])


def test_staleness_rule_allows_up_to_max_staleness_versions():
    lim = AsyncLimits(max_in_flight=10, max_staleness=2)
    assert lim.is_fresh(unit_policy_version=3, trainer_version=5)
    assert not lim.is_fresh(unit_policy_version=3, trainer_version=6)
    assert AsyncLimits(max_staleness=0).is_fresh(4, 4)
    assert not AsyncLimits(max_staleness=0).is_fresh(4, 5)
    assert lim.free_slots(7) == 3 and lim.free_slots(12) == 0
    with pytest.raises(GRPOError):
        AsyncLimits(max_in_flight=0)


def test_agent_trajectory_trains_only_on_model_tokens():
    from rl.grpo import sample_from_turns

    # turn 0: prompt [1, 2] -> model says [3, 4]; tool observation [5, 6] is appended;
    # turn 1: prompt [1, 2, 3, 4, 5, 6] -> model says [7]
    s = sample_from_turns([([1, 2], [3, 4], [-0.1, -0.2]),
                           ([1, 2, 3, 4, 5, 6], [7], [-0.3])], advantage=2.0)
    assert s.prompt_ids == [1, 2]
    assert s.completion_ids == [3, 4, 5, 6, 7]
    assert s.loss_mask == [1, 1, 0, 0, 1]
    assert s.old_logprobs == pytest.approx([-0.1, -0.2, 0.0, 0.0, -0.3])
    b = collate([s], pad_token_id=0)
    assert b.loss_mask[0].tolist() == [0, 1, 1, 0, 0, 1]
    with pytest.raises(GRPOError, match="turn 1.*token 2"):
        sample_from_turns([([1, 2], [3], [-0.1]), ([1, 2, 9], [7], [-0.3])], 1.0)


def test_truncated_importance_weight_multiplies_the_policy_gradient_loss():
    # tis_cap (slime/verl TIS): w_t = min(exp(learner_logp_t - engine_logp_t), cap), the
    # learner's log-prob taken before the step (detached), and the PPO ratio taken against
    # it. Token 0: learner -1.0, engine -1.5 -> exp(0.5) = 1.6487, capped at 1.2.
    # Token 1: learner -1.5, engine -1.0 -> exp(-0.5) = 0.6065, under the cap.
    # At the learner's own weights the ratio is 1, so l_t = -A * w_t and dl/dlogp_t = -A * w_t.
    new = torch.tensor([[-1.0, -1.5]], requires_grad=True)
    engine = torch.tensor([[-1.5, -1.0]])
    cfg = GRPOLossConfig(tis_cap=1.2)
    loss, st = policy_loss_per_token(new, engine, torch.tensor([2.0]), cfg)
    w = [1.2, math.exp(-0.5)]
    assert loss[0].tolist() == pytest.approx([-2.0 * w[0], -2.0 * w[1]])
    assert st["tis_weight"][0].tolist() == pytest.approx(w)
    loss.sum().backward()
    assert new.grad[0].tolist() == pytest.approx([-2.0 * w[0], -2.0 * w[1]])
    # Off (the default): the ratio is taken against the engine's log-probs, no weight.
    plain, st = policy_loss_per_token(new.detach(), engine, torch.tensor([2.0]), GRPOLossConfig())
    assert plain[0].tolist() == pytest.approx([-2.0 * 1.28, -2.0 * math.exp(-0.5)])
    assert "tis_weight" not in st


def test_tis_cap_must_be_positive():
    with pytest.raises(GRPOError, match="tis_cap"):
        GRPOLossConfig(tis_cap=0.0)


def test_logprob_mismatch_sums_abs_difference_and_k3_over_sampled_tokens():
    from rl.grpo import logprob_mismatch

    # d = learner - engine = [0.1, -0.2, 5.0 (masked out)]: |d| sums to 0.3,
    # k3 = (e^0.1 - 1.1) + (e^-0.2 - 0.8) = 0.0051709 + 0.0187308
    learner = torch.tensor([[-1.0, -2.2, 3.0]])
    engine = torch.tensor([[-1.1, -2.0, -2.0]])
    abs_sum, k3_sum, n = logprob_mismatch(learner, engine, torch.tensor([[1, 1, 0]]))
    assert (abs_sum, n) == (pytest.approx(0.3), 2.0)
    assert k3_sum == pytest.approx(math.exp(0.1) - 1.1 + math.exp(-0.2) - 0.8, rel=1e-5)  # float32
    assert logprob_mismatch(engine, engine, torch.ones(1, 3))[:2] == (0.0, 0.0)
