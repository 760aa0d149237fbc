"""The learner on many ranks: sharded data-parallel GRPO with torch FSDP2.

``ShardedLearner`` has ``Learner``'s public interface (``step``, ``log_probs``, ``loss``,
``weights_for_sync``, ``save_weights``, ``save_checkpoint``, ``load_checkpoint``,
``version``) and is called on rank 0 only; every call is a command that the other ranks
run too (``rl.distributed.worker_loop``).

**Why FSDP2 and not DeepSpeed ZeRO-3.** Both run on CPU with gloo here (checked: one
ZeRO-3 step on two gloo ranks with ``DS_ACCELERATOR=cpu`` works, after a 100 s build of
DeepSpeed's shared-memory op). FSDP2 (``torch.distributed.fsdp.fully_shard``) is taken
because (1) its parameters are DTensors sharded on dim 0, so the weight sync gathers one
tensor at a time onto rank 0 and a rank's share of the optimizer state is measurable, and
(2) its state dicts are what ``torch.distributed.checkpoint`` (DCP) reshards on load, so a
checkpoint written by 8 ranks resumes on 16 or on 1; ZeRO-3 checkpoints are tied to the
rank count that wrote them (resharding needs DeepSpeed's offline universal-checkpoint
conversion). It also needs only torch, so the GPU check (``bench/sharded_learner_gpu.py``)
runs where DeepSpeed is not installed.

**Sharding.** Every decoder layer is one FSDP unit, the embeddings / final norm / head
the root unit (a tied head shares the embedding's parameter). Parameters, gradients and
AdamW state are split over the ranks (``reshard_after_forward``: a layer's full weights
exist only while it runs).

**A step.** Rank 0 splits the samples over ranks by tokens (``token_balanced_partition``)
and scatters them; each rank runs its micro-batches of ``micro_batch_size`` sequences.
Every micro-batch loss is normalised by the *global* batch's sequence and token counts,
and each rank's loss is scaled by the rank count before FSDP's averaging reduce-scatter,
so the summed gradient is exactly the one-rank gradient of the whole batch: N ranks take the same step
as one. FSDP's collectives run once per forward/backward, so every rank runs the same
number of micro-batches; a rank with fewer runs a zero-weight one (a 2-token dummy).

**Weight sync.** Parameters are gathered onto rank 0 in buckets of ``sync_bucket_mb``
(``dist.gather`` of each shard; the other ranks never hold a full tensor), and each
bucket is handed on and freed before the next: ``save_weights`` writes one safetensors
file per bucket plus the Hugging Face index (``model.safetensors.index.json``) into the
shared-memory folder of the HTTP reload; ``weights_for_sync(to_cpu=False)`` streams them
to the NCCL broadcast (each tensor is gathered when the broadcast reaches it). The tied
``lm_head.weight`` is included, equal to the embedding (a copy on CPU), as in ``Learner``.
Gather time and peak memory per rank are in ``last_sync_stats``.

**Checkpoints.** DCP: every rank writes its shards into ``folder/dcp`` (on several
nodes, ``folder`` must be on a filesystem every node sees); rank 0 writes
``trainer_state.json`` (version, sampler and mixture ledger state, as ``Learner``) and
swaps the folder into place. Loading reshards to this run's rank count.

Limits: every rank loads the full model into host memory once before sharding it (a
32B model in bf16 is 64 GB per rank, transiently), and one micro-batch's activations
must fit one device.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist

from rl.distributed import RankError, RankGroup, token_balanced_partition
from rl.grpo import TrainSample, collate, logprob_mismatch, masked_mean
from rl.learner import (STATE_FILE, Learner, LearnerConfig, LearnerError, checkpoint_state,
                        fresh_sibling, load_policy, swap_into_place)
from rl.learner import _resolve_device as resolve_device

INDEX_FILE = "model.safetensors.index.json"
DCP_DIR = "dcp"

# What each rank sums over its micro-batches in a step, reduced on rank 0 (token-weighted
# sums, so the ranks' parts add up to the one-rank figures).
_SUMS = ("loss", "clipped", "ratio", "kl", "tokens", "mismatch_abs", "mismatch_k3",
         "mismatch_tokens", "tis")


def peak_memory_reset(device: torch.device) -> None:
    """Start a new peak-memory window (CUDA allocator peak, or the process's peak RSS on
    CPU through ``/proc/self/clear_refs``)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # not Linux: the peak then covers the process's lifetime


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory since ``peak_memory_reset``: CUDA bytes allocated, or peak RSS on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def shard_model(model: torch.nn.Module, device: torch.device, world_size: int) -> torch.nn.Module:
    """``fully_shard`` each decoder layer (``model.model.layers``, or ``model.layers``) and
    then the root, over a 1-D mesh of all ranks. FSDP averages the ranks' gradients, so
    the caller scales each rank's loss by the world size to get their sum."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world_size,))
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise LearnerError(f"{type(model).__name__} has no .layers (or .model.layers) to shard; "
                           "the sharded learner needs a decoder-only model with a layer list")
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


class _Pending:
    """One tensor of a streamed sync: shape and dtype are known at once, the data is
    gathered when ``to`` reaches it (tensors must be taken in order)."""

    def __init__(self, stream: "StreamedWeights", index: int, shape, dtype):
        self._stream, self._index, self.shape, self.dtype = stream, index, torch.Size(shape), dtype

    def to(self, device) -> torch.Tensor:
        return self._stream.take(self._index).to(device)

    def contiguous(self) -> torch.Tensor:
        return self._stream.take(self._index)


class StreamedWeights:
    """name -> tensor of the gathered model for the NCCL sync, gathered bucket by bucket
    as the consumer takes the tensors in order (``items()`` costs nothing).

    Raises (from ``take``): LearnerError when a tensor is taken out of order.
    """

    def __init__(self, meta: list[tuple[str, torch.Size, torch.dtype]],
                 buckets: Iterator[list[tuple[str, torch.Tensor]]]):
        self._meta = meta
        self._buckets = buckets
        self._ready: list[tuple[str, torch.Tensor]] = []
        self._next = 0

    def keys(self):
        return [n for n, _, _ in self._meta]

    def __len__(self) -> int:
        return len(self._meta)

    def __iter__(self):
        return iter(self.keys())

    def items(self):
        return [(n, _Pending(self, i, s, d)) for i, (n, s, d) in enumerate(self._meta)]

    def take(self, index: int) -> torch.Tensor:
        if index != self._next:
            raise LearnerError(f"streamed weights taken out of order (tensor {index}, expected "
                               f"{self._next}): consume items() from first to last")
        if not self._ready:
            self._ready = list(next(self._buckets))
        name, t = self._ready.pop(0)
        self._next += 1
        if self._next == len(self._meta):
            for _ in self._buckets:  # let the generator finish its bookkeeping
                pass
        return t


class ShardedLearner(Learner):
    """Sharded data-parallel policy model + optimizer on ``group.world_size`` ranks.

    Built on every rank at once (rank 0: ``make_learner``; workers: the ``build``
    command). Only rank 0 calls the public methods.

    Args:
        group: the learner's ranks (``rl.distributed.RankGroup``).
        model_path: local HF folder (config.json, safetensors, tokenizer).
        cfg: options (``backend`` is ``fsdp``).
        module: instead of ``model_path``, an ``nn.Module`` whose forward takes
            ``input_ids``/``attention_mask`` and returns an object with ``.logits``, with
            a ``.layers`` (or ``.model.layers``) list; ``pad_token_id`` then required.

    Raises:
        LearnerError: the model cannot be loaded or sharded.
    """

    def __init__(self, group: RankGroup, model_path: str | Path | None, cfg: LearnerConfig,
                 *, module: torch.nn.Module | None = None, pad_token_id: int | None = None):
        self.group = group
        self.cfg = cfg
        self.model_path = str(model_path) if model_path is not None else None
        device = resolve_device(cfg.device)
        if device.type == "cuda":
            device = torch.device("cuda", group.info.local_rank)
            torch.cuda.set_device(device)
        self.device = device
        self._engine = None
        self.tokenizer = None
        if module is None:
            module, self.tokenizer, pad_token_id = load_policy(self.model_path, cfg)
        if pad_token_id is None:
            raise LearnerError("ShardedLearner(module=...) needs pad_token_id")
        self.pad_token_id = int(pad_token_id)
        self.version = 0
        module.to(device).train()
        self.model = shard_model(module, device, group.world_size)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, betas=cfg.betas,
                                           weight_decay=cfg.weight_decay)
        self.last_sync_stats: dict[str, float] = {}

    # ------------------------------------------------------------------ commands

    _COMMANDS = {"step": "_step", "loss": "_loss", "log_probs": "_log_probs",
                 "gather": "_gather_buckets", "full_state": "_full_state",
                 "save_weights": "_save_weights", "save_checkpoint": "_save_checkpoint",
                 "load_checkpoint": "_load_checkpoint"}

    def run_command(self, name: str, args: tuple) -> Any:
        """Worker ranks: run command ``name``'s collective body (``worker_loop``)."""
        body = getattr(self, self._COMMANDS[name])
        out = body(*args)
        if name == "gather":
            for _ in out:  # a generator: this rank's part is sending its shards
                pass
        return out

    def _collective(self, name: str, *args: Any) -> Any:
        """Rank 0: post ``name`` to the workers, run its body here; a failure names the rank."""
        self.group.post(name, *args)
        try:
            return getattr(self, self._COMMANDS[name])(*args)
        except (RuntimeError, OSError) as e:
            if isinstance(e, (LearnerError, RankError)):
                raise
            raise self.group.diagnose(e, name) from None

    def close(self) -> None:
        """Rank 0: tell the workers to stop, and leave the process group."""
        if self.group.rank == 0:
            self.group.post("stop")
        self.group.close()

    # ------------------------------------------------------------------ forward

    def _dummy_batch(self):
        """A zero-weight micro-batch for a rank that has no more samples (FSDP's
        collectives need every rank in every forward/backward)."""
        s = TrainSample([self.pad_token_id], [self.pad_token_id], [0.0], 0.0, loss_mask=[0])
        return collate([s], self.pad_token_id)

    def _scatter(self, payload: list | None) -> Any:
        out = [None]
        dist.scatter_object_list(out, payload, src=0)
        return out[0]

    def _plan(self, samples: Sequence[TrainSample]) -> list[list[int]]:
        return token_balanced_partition([len(s.prompt_ids) + len(s.completion_ids) for s in samples],
                                        self.group.world_size)

    def _micro_count(self, parts: list[list[int]]) -> int:
        mbs = self.cfg.micro_batch_size
        return max(1, max(math.ceil(len(p) / mbs) for p in parts))

    @torch.no_grad()
    def log_probs(self, samples: Sequence[TrainSample]) -> list[list[float]]:
        """As ``Learner.log_probs``: the samples are spread over the ranks and the results
        gathered on rank 0 in the given order."""
        collate(samples, self.pad_token_id)  # malformed input fails here, before any rank waits
        return self._collective("log_probs", list(samples))

    def _log_probs(self, samples: Sequence[TrainSample] | None) -> list[list[float]] | None:
        payload = None
        if self.group.rank == 0:
            parts = self._plan(samples)
            payload = [([samples[i] for i in p], p, self._micro_count(parts)) for p in parts]
        local, index, n_micro = self._scatter(payload)
        mbs = self.cfg.micro_batch_size
        mine: list[list[float]] = []
        with torch.no_grad():
            for k in range(n_micro):
                chunk = local[k * mbs:(k + 1) * mbs]
                if not chunk:
                    self._logp(self._dummy_batch())
                    continue
                logp = self._logp(collate(chunk, self.pad_token_id)).cpu()
                for j, s in enumerate(chunk):
                    p, c = len(s.prompt_ids), len(s.completion_ids)
                    mine.append(logp[j, p - 1:p - 1 + c].tolist())
        gathered = [None] * self.group.world_size if self.group.rank == 0 else None
        dist.gather_object((index, mine), gathered, dst=0)
        if self.group.rank != 0:
            return None
        out: list[list[float] | None] = [None] * len(samples)
        for idx, lps in gathered:
            for i, lp in zip(idx, lps):
                out[i] = lp
        return out

    def loss(self, samples: Sequence[TrainSample]) -> float:
        """As ``Learner.loss``: the GRPO loss of ``samples`` under the current weights, no
        update. The samples are spread over the ranks as in ``step`` (each micro-batch
        normalised by the whole batch's counts) and the ranks' parts summed on rank 0.

        Raises:
            GRPOError: malformed samples. RankFailure: a rank failed.
        """
        collate(samples, self.pad_token_id)
        return self._collective("loss", list(samples))

    def _loss(self, samples: Sequence[TrainSample] | None) -> float | None:
        local, n_seqs, n_tok, n_micro, _ = self._scatter_batch(samples)
        part = torch.zeros(1, dtype=torch.float64)
        with torch.no_grad():
            for mb in self._micro_batches(local, n_micro):
                if mb is None:
                    self._logp(self._dummy_batch())
                    continue
                part += float(self._batch_loss(mb, n_seqs, n_tok)[0])
        dist.reduce(part, dst=0)
        return float(part) if self.group.rank == 0 else None

    def _scatter_batch(self, samples: Sequence[TrainSample] | None):
        """Rank 0 splits ``samples`` over the ranks by tokens; every rank gets (its
        samples, the whole batch's sequence and loss-token counts, the micro-batch count
        every rank runs, per sample of its own: 1.0 when it was generated at this
        policy version (the mismatch's tokens, as ``Learner.step``), else 0.0). Only rank 0
        knows ``version``: the workers never see ``step``'s increment."""
        payload = None
        if self.group.rank == 0:
            full = collate(samples, self.pad_token_id)
            n_seqs, n_tok = len(full), float(full.loss_mask.sum())
            parts = self._plan(samples)
            n_micro = self._micro_count(parts)
            current = [float(s.policy_version is None or s.policy_version == self.version)
                       for s in samples]
            payload = [([samples[i] for i in p], n_seqs, n_tok, n_micro, [current[i] for i in p])
                       for p in parts]
        return self._scatter(payload)

    def _micro_batches(self, local: list[TrainSample], n_micro: int) -> Iterator[Any]:
        """This rank's ``n_micro`` micro-batches of ``micro_batch_size`` sequences, None
        for each one past its samples (the rank then runs a zero-weight dummy)."""
        mbs = self.cfg.micro_batch_size
        batch = collate(local, self.pad_token_id) if local else None
        for k in range(n_micro):
            if batch is not None and k * mbs < len(batch):
                yield batch.slice(k * mbs, min((k + 1) * mbs, len(batch)))
            else:
                yield None

    # ------------------------------------------------------------------ update

    def abort_step(self) -> None:
        """Does nothing: a sharded step runs to its end, since every rank must leave its
        collectives together (a stopping job waits for it; ``RankGroup.close`` then stops
        the ranks)."""

    def step(self, samples: Sequence[TrainSample]) -> dict[str, float]:
        """One GRPO update on ``samples`` over all ranks; ``version`` += 1.

        Returns ``Learner.step``'s stats (``grad_norm`` is the global norm before
        clipping; the train/inference mismatch ``mismatch/*`` summed over every rank's
        tokens before it is averaged), plus ``ranks``, ``rank_tokens_max`` / ``rank_tokens_min`` (tokens per
        rank after the partition), ``peak_mem_gib_rank<r>`` (each rank's peak memory
        during the step) and ``optimizer_state_mib_rank<r>`` (the AdamW state it holds).

        Raises:
            GRPOError: malformed samples. RankFailure: a rank failed (named, with its log).
        """
        collate(samples, self.pad_token_id)
        stats = self._collective("step", list(samples))
        self.version += 1
        return stats

    def _step(self, samples: Sequence[TrainSample] | None) -> dict[str, float] | None:
        t0 = time.perf_counter()
        peak_memory_reset(self.device)
        local, n_seqs, n_tok, n_micro, current = self._scatter_batch(samples)
        self.optimizer.zero_grad(set_to_none=True)
        mbs = self.cfg.micro_batch_size
        sums = torch.zeros(len(_SUMS), dtype=torch.float64)  # in the order of _SUMS
        for k, mb in enumerate(self._micro_batches(local, n_micro)):
            if mb is None:
                (self._logp(self._dummy_batch()).sum() * 0.0).backward()
                continue
            loss, st, mask = self._batch_loss(mb, n_seqs, n_tok)
            # FSDP's reduce-scatter averages over ranks; x world size makes it the sum
            # (gloo has no PREMUL_SUM for set_gradient_divide_factor(1)).
            (loss * self.group.world_size).backward()
            w = float(mask.sum())
            rows = torch.tensor(current[k * mbs:k * mbs + len(mb)], device=mask.device).unsqueeze(1)
            mis = logprob_mismatch(st["learner_logp"], mb.old_logp.to(mask.device), mask * rows)
            tis = masked_mean(st["tis_weight"], mask) * w if "tis_weight" in st else 0.0
            sums += torch.tensor([float(loss.detach()), masked_mean(st["clipped"], mask) * w,
                                  masked_mean(st["ratio"], mask) * w,
                                  masked_mean(st["kl"], mask) * w,
                                  float(mb.attention_mask.sum()), *mis, tis], dtype=torch.float64)
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else float("inf"))
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        self.optimizer.step()
        per_rank = [None] * self.group.world_size
        dist.all_gather_object(per_rank, (sums.tolist(), peak_memory_bytes(self.device),
                                          self.optimizer_state_bytes()))
        if self.group.rank != 0:
            return None
        tot = dict(zip(_SUMS, (sum(r[0][i] for r in per_rank) for i in range(len(_SUMS)))))
        d = max(n_tok, 1.0)
        out = {"loss": tot["loss"], "clip_frac": tot["clipped"] / d, "ratio_mean": tot["ratio"] / d,
               "kl": tot["kl"] / d, "grad_norm": grad_norm, "num_seqs": float(n_seqs),
               "num_loss_tokens": n_tok, "num_tokens": tot["tokens"], "ranks": float(self.group.world_size),
               "rank_tokens_max": max(r[0][_SUMS.index("tokens")] for r in per_rank),
               "rank_tokens_min": min(r[0][_SUMS.index("tokens")] for r in per_rank),
               "step_s": time.perf_counter() - t0, "mismatch/tokens": tot["mismatch_tokens"]}
        if tot["mismatch_tokens"] > 0:
            out["mismatch/logprob_abs_diff"] = tot["mismatch_abs"] / tot["mismatch_tokens"]
            out["mismatch/k3_kl"] = tot["mismatch_k3"] / tot["mismatch_tokens"]
        if self.cfg.loss.tis_cap is not None:
            out["tis_weight_mean"] = tot["tis"] / d
        for r, (_, peak, optim) in enumerate(per_rank):
            out[f"peak_mem_gib_rank{r}"] = peak / 2**30
            out[f"optimizer_state_mib_rank{r}"] = optim / 2**20
        return out

    # ------------------------------------------------------------------ weights

    def optimizer_state_bytes(self) -> int:
        """Bytes of optimizer state tensors held by this rank (its shards only)."""
        total = 0
        for st in self.optimizer.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    local = v.to_local() if hasattr(v, "to_local") else v
                    total += local.numel() * local.element_size()
        return total

    def _weight_meta(self) -> list[tuple[str, torch.Size, torch.dtype]]:
        return [(n, t.shape, t.dtype) for n, t in self.model.state_dict(keep_vars=True).items()]

    def _gather_one(self, t: torch.Tensor) -> torch.Tensor | None:
        """The full tensor of a dim-0-sharded DTensor on rank 0 (None elsewhere); each rank
        sends only its own shard, padded to the common chunk length."""
        if not hasattr(t, "to_local"):
            return t.detach() if self.group.rank == 0 else None
        local = t.to_local().detach()
        n, ws = t.shape[0], self.group.world_size
        chunk = math.ceil(n / ws)
        pad = torch.zeros((chunk,) + tuple(t.shape[1:]), dtype=local.dtype, device=local.device)
        pad[:local.shape[0]] = local
        bufs = [torch.empty_like(pad) for _ in range(ws)] if self.group.rank == 0 else None
        dist.gather(pad, bufs, dst=0)
        if self.group.rank != 0:
            return None
        return torch.cat(bufs)[:n].contiguous()

    def _gather_buckets(self, to_cpu: bool = True) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Rank 0: yield the model's weights (state-dict names, tied head included) in buckets
        of about ``sync_bucket_mb``; workers take part and yield nothing. Every rank cuts
        the buckets at the same places (sizes come from the global shapes). Records
        ``last_sync_stats`` when done."""
        t0 = time.perf_counter()
        peak_memory_reset(self.device)
        limit = self.cfg.sync_bucket_mb * 2**20
        first_name: dict[int, str] = {}  # id(parameter) -> its first name (ties share one)
        bucket: dict[str, torch.Tensor | None] = {}
        size, n_buckets, n_bytes = 0, 0, 0
        for name, t in self.model.state_dict(keep_vars=True).items():
            source = first_name.setdefault(id(t), name)
            if source != name and source in bucket:  # tied (lm_head = embedding), gathered already
                full = bucket[source]
                if full is not None and to_cpu:
                    full = full.clone()  # safetensors stores no two names for one tensor
            else:
                full = self._gather_one(t)
            if full is not None and to_cpu:
                full = full.cpu()
            bucket[name] = full
            size += t.numel() * t.element_size()
            if size >= limit:
                n_buckets, n_bytes = n_buckets + 1, n_bytes + size
                if self.group.rank == 0:
                    yield list(bucket.items())
                bucket, size = {}, 0
        if bucket:
            n_buckets, n_bytes = n_buckets + 1, n_bytes + size
            if self.group.rank == 0:
                yield list(bucket.items())
        bucket = {}
        per_rank = [None] * self.group.world_size
        dist.all_gather_object(per_rank, peak_memory_bytes(self.device))
        self.last_sync_stats = {"gather_s": time.perf_counter() - t0, "buckets": float(n_buckets),
                                "gathered_gib": n_bytes / 2**30,
                                **{f"peak_mem_gib_rank{r}": b / 2**30 for r, b in enumerate(per_rank)}}

    def full_state(self, optimizer: bool = True) -> dict[str, dict]:
        """The whole model and optimizer state on rank 0's CPU, gathered by DCP (not by the
        sync's buckets): ``{"model": name -> tensor, "optim": the optimizer state dict}``
        (no ``"optim"`` when ``optimizer`` is False: AdamW's state is twice the model's).
        For checking the sync against it on small models; the whole model is on rank 0
        at once."""
        return self._collective("full_state", optimizer)

    def _full_state(self, optimizer: bool) -> dict[str, dict]:
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        out = {"model": get_model_state_dict(self.model, options=opts)}
        if optimizer:
            out["optim"] = get_optimizer_state_dict(self.model, self.optimizer, options=opts)
        return out

    def weights_for_sync(self, to_cpu: bool = True) -> StreamedWeights:
        """name -> tensor of every weight an engine loads (``Learner.weights_for_sync``'s
        names, tied ``lm_head.weight`` included), streamed: ``items()`` gives tensors whose
        data is gathered bucket by bucket as they are taken in order (``.to(device)``), so
        the whole model is never on rank 0 at once. For the NCCL broadcast
        (``to_cpu=False``: gathered on the learner's GPU)."""
        self.group.post("gather", to_cpu)
        return StreamedWeights(self._weight_meta(), self._guarded(self._gather_buckets(to_cpu)))

    def _guarded(self, gen: Iterator) -> Iterator:
        try:
            yield from gen
        except (RuntimeError, OSError) as e:
            if isinstance(e, (LearnerError, RankError)):
                raise
            raise self.group.diagnose(e, "gather") from None

    def save_weights(self, folder: str | Path) -> Path:
        """Gather the weights bucket by bucket and write each bucket as one safetensors file
        of ``folder`` (``model-00001-of-0000N.safetensors``) plus ``model.safetensors.index.json``
        (the Hugging Face sharded layout, which ``reload_weights`` reads); return ``folder``."""
        return self._collective("save_weights", str(folder))

    def _save_weights(self, folder: str) -> Path | None:
        from safetensors.torch import save_file

        written: list[tuple[Path, list[str]]] = []
        out = Path(folder)
        if self.group.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
        for k, bucket in enumerate(self._gather_buckets(to_cpu=True)):
            path = out / f".model-{k + 1:05d}.safetensors.tmp"
            save_file(dict(bucket), str(path), metadata={"format": "pt",
                                                         "policy_version": str(self.version)})
            written.append((path, [n for n, _ in bucket]))
            del bucket
        if self.group.rank != 0:
            return None
        weight_map = {}
        for k, (path, names) in enumerate(written):
            final = f"model-{k + 1:05d}-of-{len(written):05d}.safetensors"
            path.replace(out / final)
            weight_map.update({n: final for n in names})
        (out / INDEX_FILE).write_text(json.dumps({"metadata": {"policy_version": self.version},
                                                  "weight_map": weight_map}))
        return out

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, folder: str | Path, extra: dict[str, Any] | None = None) -> Path:
        """Save the sharded model and optimizer (DCP: each rank its shards), version and
        ``extra`` (JSON-able, rank 0's sampler and ledger state) into ``folder``, replaced
        atomically (written beside, then renamed).

        Raises:
            LearnerError: ``extra`` is not JSON-serialisable.
        """
        folder = Path(folder)
        try:
            state_json = json.dumps({"version": self.version, "extra": extra or {},
                                     "backend": "fsdp", "world_size": self.group.world_size})
        except TypeError as e:
            raise LearnerError(f"checkpoint extra state is not JSON-serialisable: {e}") from None
        tmp = fresh_sibling(folder)
        self._collective("save_checkpoint", str(tmp))
        (tmp / STATE_FILE).write_text(state_json)
        return swap_into_place(tmp, folder)

    def _dcp_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def _save_checkpoint(self, tmp: str) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(self._dcp_state(), checkpoint_id=str(Path(tmp) / DCP_DIR))
        dist.barrier()

    def load_checkpoint(self, folder: str | Path) -> dict[str, Any]:
        """Restore a ``save_checkpoint`` folder written by any number of ranks (DCP
        reshards to this run's); return the caller's ``extra`` dict.

        Raises:
            LearnerError: no checkpoint there, or it was not written by this learner.
        """
        folder = Path(folder)
        state = checkpoint_state(folder, "fsdp")
        self._collective("load_checkpoint", str(folder))
        self.version = int(state["version"])
        return dict(state["extra"])

    def _load_checkpoint(self, folder: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        sd = self._dcp_state()
        dcp.load(sd, checkpoint_id=str(Path(folder) / DCP_DIR))
        set_state_dict(self.model, self.optimizer, model_state_dict=sd["model"],
                       optim_state_dict=sd["optim"])


def make_sharded_learner(group: RankGroup, model_path: str | Path, cfg: LearnerConfig) -> ShardedLearner:
    """Rank 0: have every rank build the ``ShardedLearner`` (the ``build`` command) and
    return rank 0's."""
    group.post("build", str(model_path), cfg)
    try:
        return ShardedLearner(group, model_path, cfg)
    except (RuntimeError, OSError) as e:
        if isinstance(e, (LearnerError, RankError)):
            raise
        raise group.diagnose(e, "build") from None
