"""rl.compare: the Table 4 rows relative to the first router, and its command-line checks."""

from __future__ import annotations

import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from common.config import ConfigError
from rl.compare import comparison_rows, run_labels, seed_list, seeds_markdown, seeds_summary


def test_rows_are_changes_relative_to_the_first_router():
    summaries = {
        "vllm": {"iteration_s": 100.0, "requests_per_min": 50.0, "samples_per_min": 10.0,
                 "prefill_tok_s": 1000.0, "decode_tok_s": 200.0, "prefix_hit_rate": 0.745,
                 "consumed_mixture": {"agent": 0.483, "rlvr": 0.294, "rlhf": 0.224}},
        "misa-t": {"iteration_s": 77.2, "requests_per_min": 66.25, "samples_per_min": 13.56,
                   "prefill_tok_s": 1336.0, "decode_tok_s": 276.0, "prefix_hit_rate": 0.962,
                   "consumed_mixture": {"agent": 0.459, "rlvr": 0.333, "rlhf": 0.208}},
    }
    header, rows = comparison_rows(summaries)
    assert header[:6] == ["Router", "Iter. time", "RPM", "Sample rate", "Prefill TPS", "Decode TPS"]
    assert rows[0][1:6] == ["+0.0%"] * 5
    assert rows[1][1:6] == ["-22.8%", "+32.5%", "+35.6%", "+33.6%", "+38.0%"]
    assert rows[1][6] == "96.2%"
    assert rows[1][7:] == ["45.9", "20.8", "33.3"]  # agent, rlhf, rlvr (sorted)


def test_unknown_router_in_the_list_is_refused_with_the_options():
    r = subprocess.run([sys.executable, "-m", "rl.compare", "routers=[vllm,misa-x]"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2  # as rl.train router=misa-x
    assert "misa-x" in r.stderr and "misa-t" in r.stderr and "Traceback" not in r.stderr


def test_a_misspelt_router_in_the_list_is_named_with_the_nearest_before_the_count(tmp_path):
    _refused(tmp_path, "routers=[misa_t,vllm]", "routers: misa_t is not a router option (did you mean misa_t -> misa-t?)")
    _refused(tmp_path, "routers=[vlm]", "(did you mean vlm -> vllm?)")  # not "give two or more" first


def _refused(tmp_path, arg: str, said: str) -> None:
    """``rl.compare run_dir=... arg`` exits 2 saying ``said``, no traceback, and starts no run."""
    run_dir = tmp_path / "cmp"
    r = subprocess.run([sys.executable, "-m", "rl.compare", f"run_dir={run_dir}", arg],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert said in r.stderr and "Traceback" not in r.stderr
    assert "router=" not in r.stdout and not run_dir.exists()  # no run was started


def test_one_value_where_a_list_belongs_is_refused_with_the_list_form(tmp_path):
    _refused(tmp_path, "routers=misa-t", "routers=misa-t: give a list in brackets, e.g. 'routers=[vllm,misa-t]'")
    _refused(tmp_path, 'train_overrides="trainer.iterations=4"', "train_overrides=trainer.iterations=4: give a list")


def test_bad_train_overrides_are_refused_before_any_run(tmp_path):
    _refused(tmp_path, 'train_overrides=["trainer.iteratons=3"]', "unknown config key 'trainer.iteratons'")
    _refused(tmp_path, 'train_overrides=["trainer.iterations=abc"]', "trainer")


def test_a_router_named_twice_runs_twice_under_a_second_label():
    assert run_labels(["vllm", "kv-horizon", "vllm", "vllm"]) == ["vllm", "kv-horizon", "vllm-2", "vllm-3"]


def test_seed_is_one_seed_or_a_list_of_different_ones():
    assert seed_list(0) == [0]
    assert seed_list(OmegaConf.create({"s": [3, 4, 5]}).s) == [3, 4, 5]
    for bad, said in (([3, 3], "seed=[3,3]: a seed is given twice"), ([], "the list is empty"),
                      ([1, -1], "-1 is not a whole number >= 0"), ("abc", "seed=abc: 'abc' is not"),
                      ([True], "True is not")):
        with pytest.raises(ConfigError, match=r"seed=.*give one seed \(seed=0\) or a list"):
            seed_list(bad)
        with pytest.raises(ConfigError) as e:
            seed_list(bad)
        assert said in str(e.value)


def _run(it_s: float, samples: float, tv: float, hit: float = 0.7) -> dict:
    return {"iteration_s": it_s, "requests_per_min": 10.0, "samples_per_min": samples, "prefill_tok_s": 100.0,
            "decode_tok_s": None, "prefix_hit_rate": hit, "tv_distance": tv}


def test_seeds_summary_gives_each_change_as_mean_and_spread_over_the_seeds():
    per_seed = {3: {"vllm": _run(100.0, 20.0, 0.02), "kv-horizon": _run(110.0, 18.0, 0.01)},
                4: {"vllm": _run(200.0, 10.0, 0.03), "kv-horizon": _run(190.0, 12.0, 0.01, hit=0.8)}}
    firsts = {3: {"vllm": 180.0, "kv-horizon": 200.0}, 4: {"vllm": 220.0, "kv-horizon": None}}
    s = seeds_summary(per_seed, firsts)
    it = s["changes"]["kv-horizon"]["iteration_s"]
    assert it["per_seed"] == [pytest.approx(10.0), pytest.approx(-5.0)]
    assert it["mean"] == pytest.approx(2.5) and it["spread"] == pytest.approx(10.6066, rel=1e-4)
    assert s["changes"]["kv-horizon"]["samples_per_min"]["per_seed"] == [pytest.approx(-10.0), pytest.approx(20.0)]
    assert "decode_tok_s" not in s["changes"]["kv-horizon"]  # missing in the runs: left out, not 0
    assert s["routers"]["vllm"] == {"tv_pp": pytest.approx(2.5), "prefix_hit": pytest.approx(0.7),
                                    "iteration_s": pytest.approx(150.0), "first_iteration_s": pytest.approx(200.0),
                                    "generation_wait_s": None, "update_s": None, "loss/num_tokens": None,
                                    "update_s_per_1k_tokens": None, "cpu_update/job": None,
                                    "cpu_update/engines": None}
    assert s["routers"]["kv-horizon"]["first_iteration_s"] is None  # a seed without it: no mean
    md = seeds_markdown(s, "t")
    assert "| kv-horizon | +2.5% ± 10.6 (+10.0, -5.0) |" in md and "| vllm | 150.0 | 200.0 | 2.50 | 70.0% |" in md
    assert "| kv-horizon | 150.0 | n/a | 1.00 | 75.0% |" in md


def test_the_summary_says_where_each_routers_iteration_time_went():
    def run(wait: float, update: float, tokens: float, engines: float | None = 0.5) -> dict:
        return {**_run(wait + update, 10.0, 0.01), "generation_wait_s": wait, "update_s": update,
                "loss/num_tokens": tokens, "update_s_per_1k_tokens": 1000 * update / tokens,
                "cpu_update/job": 1.25, "cpu_update/engines": engines}

    per_seed = {0: {"vllm": run(10.0, 60.0, 6000.0), "kv-horizon": run(20.0, 90.0, 6000.0, 0.75)},
                1: {"vllm": run(30.0, 80.0, 10000.0, None), "kv-horizon": run(0.0, 90.0, 12000.0)}}
    s = seeds_summary(per_seed, {0: {"vllm": 1.0, "kv-horizon": 1.0}, 1: {"vllm": 1.0, "kv-horizon": 1.0}})
    kv = s["routers"]["kv-horizon"]
    assert kv["generation_wait_s"] == 10.0 and kv["update_s"] == 90.0 and kv["loss/num_tokens"] == 9000.0
    assert kv["update_s_per_1k_tokens"] == pytest.approx((15.0 + 7.5) / 2)
    md = seeds_markdown(s, "t")
    assert ("| Router | generation wait (s) | update (s) | tokens per update | update s per 1k tokens | "
            "trainer cores in update | engine cores in update |" in md)
    # a seed without the engines' cores (a run before they were recorded): no mean
    assert "| vllm | 20.0 | 70.0 | 8000 | 9.00 | 1.25 | n/a |" in md
    assert "| kv-horizon | 10.0 | 90.0 | 9000 | 11.25 | 1.25 | 0.62 |" in md


def test_one_router_and_a_bad_seed_list_are_refused_before_any_run(tmp_path):
    _refused(tmp_path, "routers=[vllm]", "routers=['vllm']: give two or more router options")
    # a router named twice is accepted (an A/A control): the refusal is the seed's
    run_dir = tmp_path / "cmp"
    r = subprocess.run([sys.executable, "-m", "rl.compare", f"run_dir={run_dir}", "routers=[vllm,vllm]", "seed=[0,0]"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "seed=[0,0]: a seed is given twice" in r.stderr and "Traceback" not in r.stderr
    assert not run_dir.exists()


def test_train_overrides_may_not_replace_what_each_run_is_given(tmp_path):
    _refused(tmp_path, 'train_overrides=["seed=7"]',
             "train_overrides: 'seed=7' would replace the seed rl.compare sets for each run; "
             "give the seeds as seed=[...]")
    _refused(tmp_path, 'train_overrides=["+router=misa-t"]', "list the routers in routers=[...]")


def test_a_key_of_the_runs_on_rl_compares_own_command_line_is_refused_not_dropped(tmp_path):
    """Each run composes its own config: ``rl.compare trainer.iterations=3`` would never reach
    it, so it is refused with the ``train_overrides`` form that does."""
    from rl.compare import refuse_run_keys

    _refused(tmp_path, "trainer.iterations=3", """trainer.iterations=3: rl.compare does not pass this to its """
             """runs; give it to every run as 'train_overrides=["trainer.iterations=3"]'""")
    for bad in ("engine=gpu", "model.path=/m", "+trainer.new=1", "~trainer.eval"):
        with pytest.raises(ConfigError, match="train_overrides="):
            refuse_run_keys(["routers=[vllm,misa-t]", bad])
    refuse_run_keys(["recipe=mixed_step", "routers=[vllm,misa-t]", "seed=[3,4]", "run_dir=/tmp/x",
                     'train_overrides=["trainer.iterations=4"]', "hydra.verbose=true"])  # its own: accepted


def test_a_figure_that_is_not_finite_or_has_a_zero_baseline_is_left_out():
    per_seed = {0: {"a": _run(100.0, 0.0, 0.01), "b": _run(float("nan"), 5.0, 0.02)},
                1: {"a": _run(100.0, 10.0, 0.01), "b": _run(90.0, 5.0, 0.02)}}
    s = seeds_summary(per_seed, {0: {"a": 1.0, "b": float("nan")}, 1: {"a": 3.0, "b": 2.0}})
    assert "iteration_s" not in s["changes"]["b"] and "samples_per_min" not in s["changes"]["b"]
    assert s["changes"]["b"]["requests_per_min"]["mean"] == pytest.approx(0.0)
    assert s["routers"]["b"]["iteration_s"] is None and s["routers"]["b"]["first_iteration_s"] is None
    assert "| b | n/a | +0.0% ± 0.0 (+0.0, +0.0) | n/a |" in seeds_markdown(s, "t")


def test_the_summary_plot_names_every_router_and_draws_without_figures(tmp_path):
    import matplotlib.image

    from rl.compare import _plot_seeds

    s = seeds_summary({0: {"a": _run(100.0, 10.0, 0.01), "b": _run(float("nan"), 5.0, 0.02)},
                       1: {"a": _run(100.0, 10.0, 0.01), "b": _run(90.0, 6.0, 0.02)}},
                      {0: {"a": 1.0, "b": 1.0}, 1: {"a": 1.0, "b": 1.0}})
    # b has no iteration time: still in the legend
    assert _plot_seeds(s, tmp_path / "p.png") == ["b"]
    assert matplotlib.image.imread(tmp_path / "p.png").shape[0] > 100
    s["changes"] = {"b": {}}
    assert _plot_seeds(s, tmp_path / "empty.png") == []  # nothing to draw: no legend, no warning
    assert (tmp_path / "empty.png").stat().st_size > 0
