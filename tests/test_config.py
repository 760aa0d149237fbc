"""The command line: clear errors for unknown keys and options, resolved config on request."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from common.config import ConfigError, compose
from tests.conftest import GSM8K_TINY_OVERRIDE, STAND_IN_MODEL_OVERRIDE


def _run(*args: str) -> subprocess.CompletedProcess:
    if not any(a.startswith("trainer.domains.rlvr.gsm8k.path=") for a in args):
        args = (GSM8K_TINY_OVERRIDE, *args)  # before any --flag
    return subprocess.run([sys.executable, "-m", "rl.train", *args], capture_output=True,
                          text=True, timeout=120)


def test_unknown_router_lists_the_valid_ones():
    r = _run("router=misa-x")
    assert r.returncode == 2
    assert "router=misa-x" in r.stderr and "misa-t" in r.stderr and "vllm" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_unknown_key_lists_the_keys_of_its_section():
    r = _run("engine.num_engine=3")
    assert r.returncode == 2
    assert "engine.num_engine" in r.stderr and "num_engines" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_bad_engine_value_is_a_one_line_error_without_traceback(tmp_path):
    r = _run("engine.num_engines=0", f"run_dir={tmp_path}/run")
    assert r.returncode == 2
    assert "engine.num_engines=0 is invalid" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not (tmp_path / "run").exists()  # a refused command leaves no empty run folder


def test_run_folder_with_more_than_hydra_files_is_kept(tmp_path, monkeypatch):
    """Only a folder holding nothing but Hydra's own files is removed on a refused command."""
    from hydra.core.hydra_config import HydraConfig

    from common.config import _remove_refused_run_dir

    for name, extra in (("empty", None), ("used", "metrics.jsonl")):
        out = tmp_path / name
        (out / ".hydra").mkdir(parents=True)
        (out / "train.log").write_text("")
        if extra:
            (out / extra).write_text("{}")
        monkeypatch.setattr(HydraConfig, "get", classmethod(lambda cls, out=out: OmegaConf.create(
            {"runtime": {"output_dir": str(out)}})))
        _remove_refused_run_dir()
    assert not (tmp_path / "empty").exists() and (tmp_path / "used" / "metrics.jsonl").exists()


def test_cfg_job_prints_the_resolved_config():
    r = _run("recipe=mixed_step", "router=misa-t", "engine.kv_cache_space_gib=2", "--cfg", "job",
             "--resolve")
    assert r.returncode == 0, r.stderr
    assert "policy: misa_t" in r.stdout
    assert "kv_cache_space_gib: 2" in r.stdout
    assert "${" not in r.stdout  # resolved


def test_compose_raises_config_error_for_a_missing_group_option():
    with pytest.raises(ConfigError, match="Valid options for model: hf, smollm2-135m") as e:
        compose("train", ["model=llama-70b"])
    assert "Did you mean" not in str(e.value)  # nothing close: no guess
    with pytest.raises(ConfigError, match=r"recipe=mixed_stp: no such recipe. Did you mean recipe=mixed_step\? "
                                          r"Valid options for recipe: "):
        compose("train", ["recipe=mixed_stp"])
    with pytest.raises(ConfigError, match=r"Did you mean recipe=mixed_step or recipe=mixed_step_gpu\?"):
        compose("train", ["recipe=mixed_step_cpu"])  # not the GPU recipe first
    with pytest.raises(ConfigError, match=r"router=MISA-T: no such router. Did you mean router=misa-t\?"):
        compose("train", ["router=MISA-T"])  # case-blind


def test_recipe_overrides_group_defaults():
    cfg = compose("train", ["recipe=mixed_step"])
    assert cfg.engine.kv_cache_space_gib == 0.5  # set by the recipe over engine/cpu.yaml
    assert cfg.trainer.max_in_flight == 32  # set by the recipe over trainer/grpo.yaml
    assert set(cfg.trainer.rho) == {"agent", "rlvr", "rlhf"}


def test_repo_relative_paths_resolve_from_the_repository_root():
    from omegaconf import OmegaConf

    from common.config import REPO_ROOT

    cfg = compose("train", [])
    path = OmegaConf.to_container(cfg.trainer.domains.rlvr.gsm8k, resolve=True)["path"]
    assert path == str((REPO_ROOT / "../shared/data/gsm8k/train.jsonl").resolve())


@pytest.mark.parametrize("override,expect", [
    ("trainer.learner.backend=jax", "trainer.learner"),
    ("trainer.rho.agent=-5", "trainer.rho: the weight of class 'agent' is -5: give a finite number >= 0"),
    ("trainer.loss.eps_low=abc", "trainer.loss: option 'eps_low' must be a number, got 'abc'"),
    ("trainer.iterations=0", "trainer.iterations=0"),
    ("trainer.agent_timeout_s=0", "trainer.agent_timeout_s=0: give a number of seconds > 0"),
    ("trainer.learner.world_size=2", "trainer.learner.world_size=2, but the launcher started 1"),
    ("trainer.learner.sync_bucket_mb=0", "learner.sync_bucket_mb and learner.collective_timeout_s"),
    (("trainer.domains.rlvr.gsm8k.path=/nonexistent/train.jsonl", "trainer.domains.rlvr.gsm8k.weight=0.5"),
     "trainer.domains.rlvr.gsm8k: GSM8K file /nonexistent/train.jsonl does not exist"),
    ("trainer.domains.rlvr.code.weight=lots", "trainer.domains.rlvr.code.weight='lots': give a number >= 0"),
])
def test_bad_trainer_values_are_refused_before_anything_starts(tmp_path, override, expect):
    overrides = override if isinstance(override, tuple) else (override,)
    r = _run(*overrides, f"run_dir={tmp_path}/run")
    assert r.returncode == 2
    assert expect in r.stderr and "Traceback" not in r.stderr + r.stdout
    assert "engines up" not in r.stdout


def test_a_domain_of_weight_0_is_off_so_its_missing_data_file_is_not_required():
    """The default recipe gives GSM8K weight 0: a machine without the GSM8K file still runs it;
    the file is required once the domain is switched on, and a class whose domains are all
    off is a class without prompt sources."""
    from rl.sampler import active_domains, sampler_from_config
    from rl.train import validate_trainer_cfg

    missing = "trainer.domains.rlvr.gsm8k.path=/nonexistent/train.jsonl"
    cfg = compose("train", ["recipe=mixed_step", STAND_IN_MODEL_OVERRIDE, "run_dir=runs/test", missing])
    validate_trainer_cfg(cfg.trainer)  # weight 0: not read
    tcfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert list(active_domains(tcfg["domains"])["rlvr"]) == ["arithmetic"]
    sampler = sampler_from_config({**tcfg, "rho": {"rlvr": 1.0}}, seed=0)
    assert sampler.classes["rlvr"].domain_mix == {"arithmetic": 1.0}
    assert {u.domain for _ in range(5) for u in sampler.next_group(0)} == {"arithmetic"}
    on = compose("train", ["recipe=mixed_step", STAND_IN_MODEL_OVERRIDE, "run_dir=runs/test", missing,
                           "trainer.domains.rlvr.gsm8k.weight=1"])
    with pytest.raises(ConfigError, match=r"trainer.domains.rlvr.gsm8k: GSM8K file /nonexistent/train.jsonl "
                                          r"does not exist.*trainer.domains.rlvr.gsm8k.weight=0"):
        validate_trainer_cfg(on.trainer)
    all_off = compose("train", ["recipe=mixed_step", STAND_IN_MODEL_OVERRIDE, "run_dir=runs/test", missing,
                                "trainer.domains.rlvr.arithmetic.weight=0"])
    with pytest.raises(ConfigError, match=r"trainer.rho: .*\['rlvr'\] have a positive target share but no "
                                          r"prompt sources"):
        validate_trainer_cfg(all_off.trainer)
    for bad, written in ((-1, "-1"), (True, "true"), (float("nan"), "nan"), ("x", "'x'")):
        # echoed as the command line writes it (true, not Python's True)
        with pytest.raises(ValueError, match=rf"trainer.domains.rlvr.code.weight={written}: give a number >= 0"):
            active_domains({"rlvr": {"code": {"weight": bad}}})


# --------------------------------------------------------------------------- the GPU recipe


def _gpu(*overrides: str):
    return compose("train", ["recipe=mixed_step_gpu", STAND_IN_MODEL_OVERRIDE, "run_dir=runs/test",
                             GSM8K_TINY_OVERRIDE, *overrides])


def test_gpu_recipe_passes_every_check_the_job_runs_before_engines_start(monkeypatch):
    from omegaconf import OmegaConf

    from rl.learner import learner_config
    from rl.train import validate_job_cfg, validate_trainer_cfg
    from rollout.engines import engine_argv, validate_engine_cfg
    from rollout.weight_sync import WORKER_EXTENSION, weight_sync_config

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("rl.train.visible_gpu_count", lambda: 8)  # an 8-GPU node
    cfg = _gpu()
    validate_trainer_cfg(cfg.trainer)
    validate_engine_cfg(cfg.engine)
    placement = validate_job_cfg(cfg)  # both of the above, model.path, GPUs, weight sync
    assert placement.engines == ("0,1", "2,3", "4,5") and placement.trainer == "6,7"

    trainer = OmegaConf.to_container(cfg.trainer, resolve=True)
    learner = learner_config(trainer)
    assert (learner.backend, learner.zero_stage, learner.dtype, learner.device) == \
        ("deepspeed", 2, "bfloat16", "cuda")
    assert weight_sync_config(trainer["weight_sync"]).method == "nccl"
    assert trainer["max_in_flight"] == 512 and trainer["max_tokens"]["rlvr"] == 131072
    assert trainer["agent_limits"]["max_context_tokens"] == cfg.model.max_model_len == 131072
    argv = engine_argv(cfg.engine, "/tmp/x", "policy", 131072, "bfloat16", 8001, 5557)
    flags = dict(zip(argv, argv[1:]))
    assert flags["--worker-extension-cls"] == WORKER_EXTENSION
    assert flags["--tensor-parallel-size"] == "2" and "--kv-cache-memory-bytes" not in flags


def test_gpu_recipe_on_a_machine_without_gpus_is_refused_before_engines_start(monkeypatch):
    from rl.train import validate_job_cfg, visible_gpu_count
    from rollout.engines import EngineError

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    import torch

    if torch.cuda.device_count() == 0:  # this machine: the real count, from a child process
        assert visible_gpu_count() == 0
    monkeypatch.setattr("rl.train.visible_gpu_count", lambda: 0)
    with pytest.raises(EngineError, match="engine=gpu, but this machine has no GPU"):
        validate_job_cfg(_gpu())
    monkeypatch.setattr("rl.train.visible_gpu_count", lambda: 4)  # too few for 3 x TP=2 + learner
    with pytest.raises(EngineError, match="sees 4 GPUs"):
        validate_job_cfg(_gpu())


def test_gpu_recipe_cfg_job_resolves_and_compare_composes_it():
    r = _run("recipe=mixed_step_gpu", "model.path=/tmp/x", "--cfg", "job", "--resolve")
    assert r.returncode == 0, r.stderr
    assert "kind: gpu" in r.stdout and "method: nccl" in r.stdout and "${" not in r.stdout
    assert compose("compare", ["recipe=mixed_step_gpu"]).recipe.name == "mixed_step_gpu"


def test_gpu_recipe_without_model_path_names_the_key_and_what_to_pass(tmp_path):
    from rl.train import validate_job_cfg
    from rollout.model import ModelPrepareError, resolve_model_path

    cfg = compose("train", ["recipe=mixed_step_gpu", "run_dir=runs/test"])
    for check in (validate_job_cfg, lambda c: resolve_model_path(c.model)):
        with pytest.raises(ModelPrepareError, match=r"model.path is required.*pass model.path="):
            check(cfg)
    r = _run("recipe=mixed_step_gpu", f"run_dir={tmp_path}/run")
    assert r.returncode == 2
    assert "model.path is required" in r.stderr and "Traceback" not in r.stderr + r.stdout
    assert "engines up" not in r.stdout  # refused before anything starts


@pytest.mark.parametrize(("raised", "code", "why"), [("KeyboardInterrupt()", 130, "Ctrl-C"),
                                                      ("SystemExit(143)", 143, "SIGTERM")])
def test_ctrl_c_and_sigterm_end_with_one_stopped_line_not_a_traceback(tmp_path, raised, code, why):
    """An entry point interrupted while running (its with/finally blocks stop its children)."""
    script = ("import sys\nfrom common.config import hydra_entry\n"
              "@hydra_entry('router_service')\n"
              f"def main(cfg):\n    raise {raised}\n"
              "sys.argv = ['entry']\nmain()\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
                         timeout=60)
    assert run.returncode == code
    assert run.stderr == f"stopped ({why}); every process this command started has been stopped\n"


# --------------------------------------------------------------------------- engines elsewhere


def test_engine_urls_without_kv_event_endpoints_are_refused_naming_both_keys(tmp_path):
    # The router used to start, then exit on engines.kv_event_endpoints=[null].
    r = _run("engine.urls=[http://127.0.0.1:9]", f"run_dir={tmp_path}/run")
    assert r.returncode == 2, r.stderr  # a mistake in the config
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in r.stderr + r.stdout
    assert "engine.urls" in err[0] and "engine.kv_event_endpoints" in err[0]
    assert "engine.kv_events=false" in err[0]  # and what to do instead
    assert "engines up" not in r.stdout
    assert not (tmp_path / "run").exists()


def test_kv_event_endpoints_with_kv_events_off_are_refused(tmp_path):
    r = _run("engine.urls=[http://127.0.0.1:9]", "engine.kv_event_endpoints=[tcp://127.0.0.1:5557]",
             "engine.kv_events=false", f"run_dir={tmp_path}/run")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "engine.kv_events=false" in r.stderr and "engine.kv_event_endpoints" in r.stderr


def test_engines_without_kv_events_give_the_router_no_endpoint_list():
    from rl.train import validate_job_cfg
    from rollout.engines import EngineHandle, EnginePool

    cfg = compose("train", ["run_dir=runs/test", "engine.urls=[http://127.0.0.1:9]",
                            "engine.kv_events=false"])
    validate_job_cfg(cfg)  # passes the pre-start checks
    # the router is given [] (runs without KV events), never [null]
    assert EnginePool([EngineHandle(0, "http://127.0.0.1:9", None)]).kv_events_endpoints == []
    pool = EnginePool([EngineHandle(0, "http://a:1", "tcp://a:2"), EngineHandle(1, "http://b:1", "tcp://b:2")])
    assert pool.kv_events_endpoints == ["tcp://a:2", "tcp://b:2"]


def test_sharded_32b_recipe_passes_every_check_the_job_runs_before_engines_start(monkeypatch):
    from omegaconf import OmegaConf

    from rl.learner import learner_config
    from rl.train import validate_job_cfg

    monkeypatch.setenv("WORLD_SIZE", "48")  # rank 0 of torchrun --nnodes 6 --nproc-per-node 8
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("rl.train.visible_gpu_count", lambda: 8)
    urls = [f"http://r{i}:8000" for i in range(1, 5)]
    events = [f"tcp://r{i}:5557" for i in range(1, 5)]
    cfg = compose("train", ["recipe=sharded_32b", STAND_IN_MODEL_OVERRIDE, "run_dir=runs/test",
                            GSM8K_TINY_OVERRIDE,  # its GSM8K is on: not the file beside the repository
                            f"engine.urls=[{','.join(urls)}]",
                            f"engine.kv_event_endpoints=[{','.join(events)}]",
                            "trainer.weight_sync.nccl_master_address=node0"])
    validate_job_cfg(cfg)
    learner = learner_config(OmegaConf.to_container(cfg.trainer, resolve=True))
    assert (learner.backend, learner.world_size, learner.dtype) == ("fsdp", 48, "bfloat16")
    monkeypatch.setenv("WORLD_SIZE", "16")  # launched on 2 nodes instead: refused, key named
    from rl.distributed import RankError

    with pytest.raises(RankError, match="trainer.learner.world_size=48, but the launcher started 16"):
        validate_job_cfg(cfg)


def test_an_unknown_key_next_to_run_dir_is_one_line_naming_it():
    from common.config import ConfigError, compose

    with pytest.raises(ConfigError, match="unknown config key 'trainer.iteratons'"):
        compose("train", ["run_dir=/tmp/x", "trainer.iteratons=3"], return_hydra_config=True)


@pytest.mark.parametrize("override, guess", [
    ("trainer.iteratons=3", "Did you mean 'trainer.iterations'? Valid keys under 'trainer'"),
    ("trainr.iterations=3", "Did you mean 'trainer.iterations'? Valid keys at the top level"),  # a section misspelt
    ("trainer.eval.problms=3", "Did you mean 'trainer.eval.problems'?"),
    # a section misspelt and the key under it too: the section alone
    ("trainr.iteratons=3", "Did you mean 'trainer' (then a key under it)? Valid keys at the top level"),
])
def test_a_misspelt_key_is_refused_with_the_nearest_key_named(override, guess):
    from common.config import ConfigError, compose

    with pytest.raises(ConfigError) as e:
        compose("train", [override])
    assert guess in str(e.value)


def test_a_key_like_no_other_gets_no_guess():
    from common.config import ConfigError, compose

    with pytest.raises(ConfigError) as e:
        compose("train", ["trainer.zzzzqqq=3"])
    assert "Did you mean" not in str(e.value) and "Valid keys under 'trainer'" in str(e.value)
    # a key under a plain value, or a section like no other: no guess rather than a wrong one
    for override in ("trainer.iterations.foo=3", "zzzzqqq.iterations=3"):
        with pytest.raises(ConfigError) as e:
            compose("train", [override])
        assert "Did you mean" not in str(e.value), str(e.value)


def test_a_key_under_an_empty_section_says_to_add_it_with_a_plus():
    from common.config import ConfigError, compose

    # recipes/sim.yaml runs vllm_router with its defaults: policy_params.vllm_router is {}
    with pytest.raises(ConfigError) as e:
        compose("sim", ["policy_params.vllm_router.cache_threshold=0.5"])
    assert str(e.value).splitlines()[0] == (
        "unknown config key 'policy_params.vllm_router.cache_threshold': 'policy_params.vllm_router' is empty "
        "here, so its options are added with a leading '+', e.g. +policy_params.vllm_router.cache_threshold=VALUE")


def test_the_readme_config_table_lists_every_option_of_each_group():
    import re

    from common.config import REPO_ROOT, group_options

    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| (.*?) \|", (REPO_ROOT / "README.md").read_text(),
                                                       re.MULTILINE)}
    for group in ("recipe", "router", "model", "engine"):
        listed = set(re.findall(r"`([\w.-]+)`", rows[group]))
        assert set(group_options(group)) <= listed, (group, sorted(set(group_options(group)) - listed))


def test_the_run_names_the_program_that_routes_it_not_only_the_policy():
    # router=vllm's policy is the real vLLM Router's cache_aware, which ours has too: the
    # run's summary title and start line say which program it was
    from rl.train import router_label

    assert router_label(compose("train", ["router=vllm"]).router) == "vllm-router (cache_aware)"
    assert router_label(compose("train", ["router=cache-aware"]).router) == "our router (cache_aware)"
    assert router_label(compose("train", ["router=kv-horizon"]).router) == "our router (kv_horizon)"
