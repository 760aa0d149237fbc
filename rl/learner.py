"""The policy update: load the HF model, GRPO loss, backward, optimizer step.

Three backends behind one API (``LearnerConfig.backend``):

- ``torch``: plain ``torch.optim.AdamW`` on one device (CPU here).
- ``deepspeed``: a DeepSpeed engine with ZeRO stage 1 or 2 (optimizer state / gradients
  partitioned across ranks). On CPU set ``DS_ACCELERATOR=cpu``; one process uses the
  gloo backend (the first run compiles a small op with g++, about a minute). On a GPU the
  same code uses NCCL (one rank on ``device`` when no launcher set up the ranks).
- ``fsdp``: the sharded learner on many ranks (``rl/sharded_learner.py``, torch FSDP2;
  ranks from torchrun, rank 0 the orchestrator). A launcher's WORLD_SIZE > 1 selects it
  (``rl.learner_launch.make_learner``).

Which GPUs the learner may use is decided by ``python -m rl.train`` before the learner is
built (``LearnerConfig.gpus``, ``rollout.engines.gpu_placement``): it narrows the trainer
process's ``CUDA_VISIBLE_DEVICES`` to GPUs no engine uses, so ``cuda`` here is the first of
them.

A step takes a list of finished units (``rl.grpo.TrainSample``), splits it into
micro-batches whose losses add up to the full-batch loss (gradient accumulation), and
takes one optimizer step; the policy version then rises by one.

Weights for the engines are written by ``save_weights`` as safetensors (the tied
``lm_head`` included: vLLM's in-place reload does not re-tie it); ``save_checkpoint``/``load_checkpoint`` keep
model, optimizer, version and a JSON-able dict from the caller (sampler and mixture
ledger state) in one folder, replaced atomically.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import torch

from common.options import build_options
from rl.grpo import (GRPOLossConfig, TrainBatch, TrainSample, aggregate_loss,
                     collate, logprob_mismatch, loss_config, masked_mean, policy_loss_per_token,
                     token_log_probs)

WEIGHTS_FILE = "model.safetensors"
STATE_FILE = "trainer_state.json"


class LearnerError(RuntimeError):
    """The learner could not load, train or checkpoint; the message says what to do."""


class StepAborted(LearnerError):
    """``Learner.step`` stopped before its optimizer step because ``abort_step`` was called
    (the job is stopping); the weights, the optimizer state and ``version`` are unchanged."""


@dataclass
class LearnerConfig:
    """Options of the policy update.

    Attributes:
        backend: ``torch`` (plain AdamW), ``deepspeed`` (ZeRO 1/2 in one rank) or
            ``fsdp`` (sharded over the launcher's ranks, ``rl/sharded_learner.py``).
        world_size: learner ranks; None = the launcher's WORLD_SIZE (1 without one). A
            number must equal WORLD_SIZE (the ranks are started by torchrun, not here).
        sync_bucket_mb: ``fsdp``: the weight sync gathers at most about this many MiB of
            full tensors onto rank 0 at a time.
        collective_timeout_s: ``fsdp``: bound on one collective; a rank that hangs fails
            the job after this long (a dead one at once).
        zero_stage: 1 or 2 (``deepspeed`` only).
        device: ``cpu``, ``cuda`` (``cuda:N``) or ``auto`` (cuda when available).
        gpus: positions in the job's GPU list (``CUDA_VISIBLE_DEVICES``, else all GPUs)
            that the trainer process gets, none of them an engine's; the learner runs on
            the first, a reward model on GPU may take another (``trainer.rewards.device``,
            ``cuda:1`` = the second). None = the first GPU after the engines'. Read by
            ``rl.train`` (``rollout.engines.gpu_placement``); ignored with engines on CPU.
        dtype: parameter dtype (float32 on CPU: bf16 is about 3x slower there).
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        betas: AdamW betas.
        max_grad_norm: clip the global gradient norm to this (0 = no clipping).
        micro_batch_size: sequences per forward/backward.
        gradient_checkpointing: recompute activations in backward (less memory).
        loss: the GRPO loss options.
    """

    backend: Literal["torch", "deepspeed", "fsdp"] = "torch"
    zero_stage: int = 1
    world_size: int | None = None
    sync_bucket_mb: float = 512.0
    collective_timeout_s: float = 600.0
    device: str = "auto"
    gpus: list[int] | None = None
    dtype: str = "float32"
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    micro_batch_size: int = 4
    gradient_checkpointing: bool = False
    loss: GRPOLossConfig = field(default_factory=GRPOLossConfig)

    def __post_init__(self) -> None:
        if self.backend not in ("torch", "deepspeed", "fsdp"):
            raise LearnerError(f"learner.backend={self.backend!r}: choose torch, deepspeed or fsdp")
        if self.world_size is not None and (isinstance(self.world_size, bool)
                                            or not isinstance(self.world_size, int) or self.world_size < 1):
            raise LearnerError(f"learner.world_size={self.world_size!r}: give a whole number >= 1 "
                               "or null (the launcher's WORLD_SIZE)")
        if not self.sync_bucket_mb > 0 or not self.collective_timeout_s > 0:
            raise LearnerError("learner.sync_bucket_mb and learner.collective_timeout_s must "
                               "be > 0")
        if self.backend == "deepspeed" and self.zero_stage not in (1, 2):
            raise LearnerError(f"learner.zero_stage={self.zero_stage}: choose 1 or 2 (stage 3 "
                               "shards parameters, which the weight sync does not gather)")
        if self.gpus is not None and (
                isinstance(self.gpus, (str, bytes)) or not all(
                    isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in self.gpus)
                or len(set(self.gpus)) != len(self.gpus)):
            raise LearnerError(f"learner.gpus={self.gpus!r}: give a list of distinct GPU "
                               "positions >= 0 (e.g. [6, 7]), or null")
        if self.micro_batch_size < 1:
            raise LearnerError(f"learner.micro_batch_size={self.micro_batch_size}: give a whole number >= 1")
        if not self.lr > 0:
            raise LearnerError(f"learner.lr={self.lr}: give a learning rate > 0, e.g. 5e-5 (the default recipe)")


def learner_config(tcfg: Mapping[str, Any]) -> LearnerConfig:
    """``LearnerConfig`` from the ``trainer`` config (``learner`` and ``loss`` sections).

    Raises:
        LearnerError / GRPOError: unknown or invalid option.
    """
    opts = dict(tcfg["learner"])
    if "betas" in opts:
        opts["betas"] = tuple(opts["betas"])
    if opts.get("gpus") is not None and not isinstance(opts["gpus"], (str, bytes)):
        opts["gpus"] = list(opts["gpus"])
    return build_options(LearnerConfig, {**opts, "loss": loss_config(tcfg["loss"])},
                         "trainer.learner", error=LearnerError)


@dataclass(frozen=True)
class DiskEstimate:
    """Disk a run needs for its checkpoints and weight sync, bytes.

    Attributes:
        checkpoint_bytes: one checkpoint: the weights (a tied head stored as a copy) and
            AdamW's two moments per parameter (``torch`` backend; DeepSpeed keeps fp32
            master weights too, and it and the sharded learner write the weights once more
            as safetensors so that the checkpoint is a model folder, so more).
        checkpoints_bytes: ``keep_last`` checkpoints plus the one being written.
        weight_sync_bytes: the ``http_reload`` folder in shared memory: the new version's
            weights beside the last one's until the engines loaded them.
    """

    checkpoint_bytes: int
    checkpoints_bytes: int
    weight_sync_bytes: int


def disk_estimate(num_params: int, tied_head_params: int, param_bytes: int,
                  keep_last: int) -> DiskEstimate:
    """``DiskEstimate`` of a model of ``num_params`` distinct parameters (``tied_head_params``
    of them an output head tied to the embedding), ``param_bytes`` per parameter (4 for
    float32), keeping the last ``keep_last`` checkpoints."""
    weights = (num_params + tied_head_params) * param_bytes
    ckpt = weights + 2 * num_params * param_bytes  # + AdamW exp_avg and exp_avg_sq
    return DiskEstimate(ckpt, (keep_last + 1) * ckpt, 2 * weights)


def fresh_sibling(folder: Path) -> Path:
    """An empty temporary folder beside ``folder`` (``.<name>.tmp``) to write a checkpoint into."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".{folder.name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def swap_into_place(tmp: Path, folder: Path) -> Path:
    """Rename the complete ``tmp`` to ``folder``, so ``folder`` always holds either the old or
    the new complete checkpoint; returns ``folder``."""
    old = folder.parent / f".{folder.name}.old"
    if folder.exists():
        if old.exists():
            shutil.rmtree(old)
        folder.rename(old)
    tmp.rename(folder)
    if old.exists():
        shutil.rmtree(old)
    return folder


def load_policy(model_path: str, cfg: LearnerConfig):
    """(model, tokenizer, pad token id) of the HF folder ``model_path``, in ``cfg.dtype``, on
    CPU, with gradient checkpointing as ``cfg`` says and the KV cache off.

    Raises:
        LearnerError: the folder cannot be loaded.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, cfg.dtype))
    except (OSError, ValueError) as e:
        raise LearnerError(f"cannot load the policy model from {model_path}: {e}. "
                           "Give a Hugging Face model folder (see rollout/model.py).") from None
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.config.use_cache = False
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return model, tokenizer, pad


def checkpoint_state(folder: Path, backend: str) -> dict[str, Any]:
    """The ``trainer_state.json`` of a checkpoint folder written by ``backend``.

    Raises:
        LearnerError: no checkpoint there, or another backend wrote it.
    """
    if not (folder / STATE_FILE).is_file():
        raise LearnerError(f"{folder} holds no checkpoint ({STATE_FILE} missing)")
    state = json.loads((folder / STATE_FILE).read_text())
    if state.get("backend") != backend:
        raise LearnerError(f"checkpoint {folder} was written by backend {state.get('backend')}, "
                           f"this learner uses {backend}; resume with the same "
                           "trainer.learner.backend")
    return state


def _resolve_device(name: str) -> torch.device:
    """The learner's device, with an index on CUDA (``cuda`` -> ``cuda:0``): DeepSpeed and
    the NCCL weight sync compare devices, and ``cuda`` never equals ``cuda:0``."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise LearnerError(f"learner.device={name} but no CUDA device is visible; use cpu")
        dev = torch.device(name)
        return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())
    return torch.device(name)


def _init_single_process_group(backend: str, device: torch.device) -> None:
    """torch.distributed with world size 1 when no launcher set it up.

    DeepSpeed puts the model on ``cuda:LOCAL_RANK``, so a single rank's LOCAL_RANK is the
    learner's GPU index (0 inside the trainer's own ``CUDA_VISIBLE_DEVICES``)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", str(device.index or 0) if device.type == "cuda" else "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        from common.process import free_port
        os.environ["MASTER_PORT"] = str(free_port("127.0.0.1"))
    import deepspeed

    deepspeed.init_distributed(dist_backend=backend)


class Learner:
    """Policy model + optimizer; one ``step`` per GRPO update.

    Args:
        model_path: local HF folder (config.json, safetensors, tokenizer).
        cfg: options.

    Attributes:
        version: policy version, 0 at load, +1 per ``step``.

    Raises:
        LearnerError: the folder cannot be loaded, or DeepSpeed is asked for on CPU
            without ``DS_ACCELERATOR=cpu``.
    """

    def __init__(self, model_path: str | Path, cfg: LearnerConfig | None = None):
        self.cfg = cfg or LearnerConfig()
        self.model_path = str(model_path)
        self.device = _resolve_device(self.cfg.device)
        model, self.tokenizer, self.pad_token_id = load_policy(self.model_path, self.cfg)
        self.version = 0
        self._running_step: object | None = None  # a token per running step (abort_step)
        self._aborted_step: object | None = None
        model.to(self.device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=self.cfg.lr, betas=self.cfg.betas,
                                weight_decay=self.cfg.weight_decay)
        self._engine = None
        if self.cfg.backend == "deepspeed":
            self._engine = self._deepspeed_engine(model, opt)
            self.model = self._engine.module
            self.optimizer = self._engine.optimizer
        else:
            self.model, self.optimizer = model, opt

    # ------------------------------------------------------------------ deepspeed

    def _deepspeed_engine(self, model: torch.nn.Module, opt: torch.optim.Optimizer):
        if self.device.type == "cpu" and os.environ.get("DS_ACCELERATOR") != "cpu":
            raise LearnerError("learner.backend=deepspeed on CPU needs the environment "
                               "variable DS_ACCELERATOR=cpu set before the process starts")
        import deepspeed

        _init_single_process_group("gloo" if self.device.type == "cpu" else "nccl", self.device)
        ds_config = {
            "train_micro_batch_size_per_gpu": self.cfg.micro_batch_size,
            # The learner owns accumulation: every micro-batch loss is already scaled to
            # the full batch, and the boundary is set by hand (set_gradient_accumulation_boundary).
            "gradient_accumulation_steps": 1,
            "gradient_clipping": self.cfg.max_grad_norm,
            "zero_optimization": {"stage": self.cfg.zero_stage},
            "bf16": {"enabled": self.cfg.dtype == "bfloat16"},
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config)
        if engine.device != self.device:
            # a launcher's LOCAL_RANK put the model elsewhere: inputs follow the model
            self.device = engine.device
        return engine

    # ------------------------------------------------------------------ forward

    def _logp(self, mb: TrainBatch) -> torch.Tensor:
        module = self._engine if self._engine is not None else self.model
        logits = module(input_ids=mb.input_ids.to(self.device),
                        attention_mask=mb.attention_mask.to(self.device)).logits
        return token_log_probs(logits, mb.input_ids.to(self.device))

    @torch.no_grad()
    def log_probs(self, samples: Sequence[TrainSample]) -> list[list[float]]:
        """The current policy's log-prob of every completion token of each sample.

        Returns one list per sample, ``len(completion_ids)`` floats each (what the
        engine's ``old_logprobs`` should match when weights are in sync).
        """
        out: list[list[float]] = []
        mbs = self.cfg.micro_batch_size
        for i in range(0, len(samples), mbs):
            chunk = samples[i:i + mbs]
            batch = collate(chunk, self.pad_token_id)
            logp = self._logp(batch).cpu()
            for j, s in enumerate(chunk):
                p, c = len(s.prompt_ids), len(s.completion_ids)
                out.append(logp[j, p - 1:p - 1 + c].tolist())
        return out

    def loss(self, samples: Sequence[TrainSample]) -> float:
        """The GRPO loss of ``samples`` under the current weights (no update)."""
        batch = collate(samples, self.pad_token_id)
        with torch.no_grad():
            return float(self._batch_loss(batch, len(batch), float(batch.loss_mask.sum()))[0])

    def _batch_loss(self, mb: TrainBatch, n_seqs: int, n_tokens: float):
        new_logp = self._logp(mb)
        dev = new_logp.device
        ref = mb.ref_logp.to(dev) if mb.ref_logp is not None else None
        per_tok, st = policy_loss_per_token(new_logp, mb.old_logp.to(dev), mb.advantages.to(dev),
                                            self.cfg.loss, ref)
        mask = mb.loss_mask.to(dev)
        st["learner_logp"] = new_logp.detach()
        return aggregate_loss(per_tok, mask, self.cfg.loss, n_seqs, n_tokens), st, mask

    # ------------------------------------------------------------------ update

    def abort_step(self) -> None:
        """Make the running ``step`` (in another thread) stop before its next micro-batch
        and raise ``StepAborted``, its gradients dropped. Called when the job stops (Ctrl-C,
        SIGTERM): a step of long agent trajectories on CPU takes minutes, and the process
        would otherwise wait for it at exit (the interpreter joins the worker thread). It
        applies to the step running when it is called: with none running it does nothing,
        and a step already past its last micro-batch finishes."""
        self._aborted_step = self._running_step

    def step(self, samples: Sequence[TrainSample]) -> dict[str, float]:
        """One GRPO update on ``samples``; ``version`` += 1.

        Returns stats: ``loss``, ``clip_frac`` (share of loss tokens whose ratio was
        clipped), ``ratio_mean``, ``kl`` (mean k3), ``grad_norm`` (before clipping; NaN
        under DeepSpeed), ``num_seqs``, ``num_loss_tokens``, ``num_tokens`` (tokens
        forwarded, prompts included, padding not: what the step's time scales with),
        ``step_s``; and the
        train/inference mismatch over the sampled tokens of the samples generated at this
        learner's version (``TrainSample.policy_version``): ``mismatch/tokens``, and when
        there are any, ``mismatch/logprob_abs_diff`` (mean |learner - engine| log-prob,
        nats) and ``mismatch/k3_kl`` (mean k3 estimate of KL(engine || learner)), from the
        loss's own forward pass before the optimizer step (``rl.grpo.logprob_mismatch``);
        with ``loss.tis_cap``, ``tis_weight_mean``.

        Raises:
            GRPOError: malformed samples (see ``rl.grpo.TrainSample``).
            StepAborted: ``abort_step`` was called; nothing was updated.
        """
        token = self._running_step = object()
        try:
            return self._step(samples, token)
        finally:
            self._running_step = None

    def _step(self, samples: Sequence[TrainSample], token: object) -> dict[str, float]:
        t0 = time.perf_counter()
        batch = collate(samples, self.pad_token_id)
        n_seqs, n_tok = len(batch), float(batch.loss_mask.sum())
        n_forwarded = float(batch.attention_mask.sum())
        mbs = self.cfg.micro_batch_size
        starts = list(range(0, n_seqs, mbs))
        total_loss, clipped, ratio_sum, kl_sum, tis_sum = 0.0, 0.0, 0.0, 0.0, 0.0
        # which rows were sampled under this version's weights (collate keeps the order)
        current = torch.tensor([float(s.policy_version is None or s.policy_version == self.version)
                                for s in samples])
        mis_abs, mis_k3, mis_n = 0.0, 0.0, 0.0
        if self._engine is None:
            self.optimizer.zero_grad(set_to_none=True)
        for k, s in enumerate(starts):
            if self._aborted_step is token:
                # the accumulated gradients are dropped (ZeRO's optimizer holds DeepSpeed's)
                self.optimizer.zero_grad(set_to_none=True)
                raise StepAborted(f"step aborted after {k} of {len(starts)} micro-batches "
                                  "(the job is stopping); nothing was updated")
            mb = batch.slice(s, min(s + mbs, n_seqs))
            if self._engine is not None:
                self._engine.set_gradient_accumulation_boundary(k == len(starts) - 1)
            loss, st, mask = self._batch_loss(mb, n_seqs, n_tok)
            if self._engine is not None:
                self._engine.backward(loss, scale_wrt_gas=False)
            else:
                loss.backward()
            w = float(mask.sum())
            total_loss += float(loss.detach())
            clipped += masked_mean(st["clipped"], mask) * w
            ratio_sum += masked_mean(st["ratio"], mask) * w
            kl_sum += masked_mean(st["kl"], mask) * w
            if "tis_weight" in st:
                tis_sum += masked_mean(st["tis_weight"], mask) * w
            rows = current[s:s + len(mb)].to(mask.device).unsqueeze(1)
            a, k, n = logprob_mismatch(st["learner_logp"], mb.old_logp.to(mask.device), mask * rows)
            mis_abs, mis_k3, mis_n = mis_abs + a, mis_k3 + k, mis_n + n
        if self._engine is not None:
            self._engine.step()
            grad_norm = float("nan")
        else:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(
                self.model.parameters(),
                self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else float("inf")))
            self.optimizer.step()
        self.version += 1
        d = max(n_tok, 1.0)
        out = {"loss": total_loss, "clip_frac": clipped / d, "ratio_mean": ratio_sum / d,
               "kl": kl_sum / d, "grad_norm": grad_norm, "num_seqs": float(n_seqs),
               "num_loss_tokens": n_tok, "num_tokens": n_forwarded,
               "step_s": time.perf_counter() - t0, "mismatch/tokens": mis_n}
        if mis_n > 0:
            out["mismatch/logprob_abs_diff"] = mis_abs / mis_n
            out["mismatch/k3_kl"] = mis_k3 / mis_n
        if self.cfg.loss.tis_cap is not None:
            out["tis_weight_mean"] = tis_sum / d
        return out

    # ------------------------------------------------------------------ weights

    def weights_for_sync(self, to_cpu: bool = True) -> dict[str, torch.Tensor]:
        """name -> tensor of every weight an engine loads, in the checkpoint's names
        (contiguous; on CPU, or where the model is when ``to_cpu`` is False, for the NCCL
        sync). A tied ``lm_head.weight`` is included, equal to the embedding: vLLM's
        ``reload_weights`` does not re-tie the head, so an engine sent no head keeps the
        one it started with (its log-probs were 1.2 nats off the learner's). On CPU the
        head is a copy, as safetensors stores no two names for one tensor."""
        out: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        for k, v in self.model.state_dict(keep_vars=False).items():
            t = (v.detach().cpu() if to_cpu else v.detach()).contiguous()
            if to_cpu and t.data_ptr() in seen:
                t = t.clone()
            seen.add(t.data_ptr())
            out[k] = t
        return out

    def save_weights(self, folder: str | Path) -> Path:
        """Write ``weights_for_sync()`` as ``folder/model.safetensors`` (atomically:
        written beside, then renamed) and return the folder."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{WEIGHTS_FILE}.tmp"
        save_file(self.weights_for_sync(), str(tmp), metadata={"format": "pt",
                                                                 "policy_version": str(self.version)})
        tmp.replace(folder / WEIGHTS_FILE)
        return folder

    def disk_estimate(self, keep_last: int) -> DiskEstimate:
        """``disk_estimate`` of this learner's model (see there)."""
        params = list(self.model.parameters())
        tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        head = self.model.get_output_embeddings() if tied else None
        return disk_estimate(sum(p.numel() for p in params),
                             head.weight.numel() if head is not None else 0,
                             params[0].element_size() if params else 4, keep_last)

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, folder: str | Path, extra: dict[str, Any] | None = None) -> Path:
        """Save model, optimizer, version and ``extra`` (JSON-able) into ``folder``.

        The checkpoint is written into a sibling temporary folder and renamed into place,
        so ``folder`` always holds either the old or the new complete checkpoint.

        Raises:
            LearnerError: ``extra`` is not JSON-serialisable.
        """
        folder = Path(folder)
        try:
            state_json = json.dumps({"version": self.version, "extra": extra or {},
                                     "backend": self.cfg.backend})
        except TypeError as e:
            raise LearnerError(f"checkpoint extra state is not JSON-serialisable: {e}") from None
        tmp = fresh_sibling(folder)
        if self._engine is not None:
            self._engine.save_checkpoint(str(tmp), tag="ckpt")
        else:
            from safetensors.torch import save_file

            save_file(self.weights_for_sync(), str(tmp / WEIGHTS_FILE))
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / STATE_FILE).write_text(state_json)
        return swap_into_place(tmp, folder)

    def load_checkpoint(self, folder: str | Path) -> dict[str, Any]:
        """Restore a ``save_checkpoint`` folder; return the caller's ``extra`` dict.

        Raises:
            LearnerError: no checkpoint there, or it was written by the other backend.
        """
        folder = Path(folder)
        state = checkpoint_state(folder, self.cfg.backend)
        if self._engine is not None:
            self._engine.load_checkpoint(str(folder), tag="ckpt")
        else:
            from safetensors.torch import load_file

            missing, unexpected = self.model.load_state_dict(
                load_file(str(folder / WEIGHTS_FILE), device=str(self.device)), strict=False)
            if unexpected or [k for k in missing if k != "lm_head.weight"]:
                raise LearnerError(f"checkpoint {folder} does not fit this model: missing "
                                   f"{missing[:3]}, unexpected {unexpected[:3]}")
            self.model.tie_weights()
            self.optimizer.load_state_dict(torch.load(folder / "optimizer.pt",
                                                      map_location=self.device))
        self.version = int(state["version"])
        return dict(state["extra"])
