"""Cost model: how long one engine step takes, and how many KV blocks an engine has.

One engine step (vLLM v1 ``EngineCore.step``) runs a batch made of prefill chunks and
decode sequences. Its duration depends on

- ``prefill_tokens``: new prompt tokens computed this step (cache hits excluded),
- ``decode_seqs``: sequences emitting one token this step,
- ``context_tokens``: tokens of KV the step's attention reads (sum over the batch of
  each sequence's context length after the step),
- ``attention_pairs``: query-key pairs the step's attention computes (a decode token
  attends its whole context; a prefill chunk of n tokens after c cached ones attends
  n*c + n(n+1)/2). This is what makes a cold 40K-token prompt expensive.

Two models give ``step_time_s(prefill_tokens, decode_seqs, context_tokens, attention_pairs)``:

- :class:`RooflineCost`: an analytic roofline from the model's shape (parameters, active
  parameters for MoE, layers, KV heads, head size) and the hardware (FLOP/s, memory
  bandwidth, TP degree). Named profiles: :data:`HARDWARE` and :data:`MODELS`.
- :class:`LinearStepCost`: ``c0 + c_prefill * prefill_tokens + c_decode * decode_seqs
  + c_context * context_tokens + c_attention * (attention_pairs - context_tokens)
  + c_mixed * [prefill_tokens > 0 and decode_seqs > 0]``, fitted
  by least squares to measured steps (:func:`fit_linear_step_cost`); :func:`cpu_smollm2_cost`
  fits it to the real vLLM numbers in ``shared/notes/vllm-cpu.md`` so the simulator can be
  checked against reality. The last term is the attention of multi-token queries: zero for
  a decode step (one query per sequence), ``(n-1)c + n(n-1)/2`` for a prefill chunk of n
  tokens after c computed ones; on the CPU engines a 64-token chunk after 1,664 cached
  tokens takes 33 ms (a third) more than after 256 (0.3-0.4 us per pair): an agent's next
  turn over a long cached history costs more than its new tokens alone say. The last is a
  fixed cost of a step that mixes a prefill chunk with decoding sequences, beyond what the
  chunk alone and the decodes alone cost: on the CPU engines a chunk sent into a running
  batch of 8-16 decoding sequences took 0-150 ms (typically 40-80) longer than the sum says.

Both are linear in ``context_tokens`` at fixed batch shape, which the engine model uses to
advance several decode steps at once (see ``router/sim/engine.py``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from router.sim.errors import SimError

GIB = 1024**3


@dataclass(frozen=True)
class HardwareProfile:
    """One accelerator: dense bf16 FLOP/s, HBM bandwidth (bytes/s) and memory (bytes)."""

    name: str
    flops_per_s: float
    mem_bw_bytes_per_s: float
    mem_bytes: float


@dataclass(frozen=True)
class ModelShape:
    """The parts of a model's shape that set its serving cost.

    Attributes:
        total_params: all parameters (MoE: every expert).
        active_params: parameters used per token (MoE: shared + top-k experts).
        layers: transformer layers that keep a KV cache.
        q_heads: attention query heads; kv_heads: KV heads (GQA); head_dim: head size.
        bytes_per_param: weight precision (2 for bf16, 1 for fp8).
        bytes_per_kv: KV-cache element size in bytes.
    """

    name: str
    total_params: float
    active_params: float
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    bytes_per_param: float = 2.0
    bytes_per_kv: float = 2.0

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V for every layer: 2 * layers * kv_heads * head_dim * bytes."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_kv


HARDWARE: dict[str, HardwareProfile] = {
    # Dense BF16 tensor-core peak and HBM bandwidth from the vendors' data sheets.
    "H200": HardwareProfile("H200", 989e12, 4.8e12, 141e9),
    "H100": HardwareProfile("H100", 989e12, 3.35e12, 80e9),
}
"""Named accelerator profiles (per GPU)."""

MODELS: dict[str, ModelShape] = {
    # Shapes "like" the paper's models; the layer/head counts are assumptions typical of
    # MoE models of that size (the paper does not give them).
    "step3.7-like": ModelShape("step3.7-like", 196e9, 11e9, layers=48, q_heads=64, kv_heads=8, head_dim=128),
    "qwen3.6-like": ModelShape("qwen3.6-like", 35e9, 3e9, layers=40, q_heads=32, kv_heads=8, head_dim=128),
    "smollm2-135m": ModelShape(
        "smollm2-135m", 135e6, 135e6, layers=30, q_heads=9, kv_heads=3, head_dim=64, bytes_per_param=4, bytes_per_kv=4
    ),
}
"""Named model shapes."""


@dataclass(frozen=True)
class RooflineCost:
    """Analytic step time: max(compute time, memory time) + a fixed per-step overhead.

    compute = 2 * active_params * tokens + 4 * layers * q_heads * head_dim * attention_pairs
    memory  = weight bytes touched + KV bytes of context_tokens
    where tokens = prefill_tokens + decode_seqs. For MoE the
    weights touched in a step grow with the tokens in it: each expert parameter is read
    if at least one token routes to it, 1 - (1 - active/total)^tokens of them.

    Attributes:
        mfu, mbu: achievable fraction of peak FLOP/s and of bandwidth.
        overhead_s: per-step fixed cost (scheduling, sampling, TP all-reduce latency).
    """

    model: ModelShape
    hardware: HardwareProfile
    tp: int = 1
    mfu: float = 0.45
    mbu: float = 0.7
    overhead_s: float = 0.004

    def step_time_s(self, prefill_tokens: int, decode_seqs: int, context_tokens: int,
                    attention_pairs: float | None = None) -> float:
        """Seconds for one step (counts as in the module docstring; ``attention_pairs``
        defaults to ``context_tokens``, i.e. one query per sequence)."""
        m = self.model
        tokens = prefill_tokens + decode_seqs
        if tokens <= 0:
            return 0.0
        pairs = context_tokens if attention_pairs is None else attention_pairs
        flops = 2.0 * m.active_params * tokens + 4.0 * m.layers * m.q_heads * m.head_dim * pairs
        expert_params = m.total_params - m.active_params
        touched_frac = 1.0 - (1.0 - m.active_params / m.total_params) ** tokens if expert_params > 0 else 1.0
        weight_bytes = m.bytes_per_param * (m.active_params + expert_params * touched_frac)
        kv_bytes = m.kv_bytes_per_token * context_tokens
        compute_s = flops / (self.tp * self.hardware.flops_per_s * self.mfu)
        memory_s = (weight_bytes + kv_bytes) / (self.tp * self.hardware.mem_bw_bytes_per_s * self.mbu)
        return self.overhead_s + max(compute_s, memory_s)


@dataclass(frozen=True)
class LinearStepCost:
    """Fitted step time (s): c0 + c_prefill*prefill_tokens + c_decode*decode_seqs
    + c_context*context_tokens + c_attention*(attention_pairs - context_tokens)
    + c_mixed*[prefill_tokens > 0 and decode_seqs > 0].

    ``c_attention_s`` is per query-key pair beyond one query per context token (the
    module docstring): what a prefill chunk over a long cached prefix costs on top of its
    tokens. ``c_mixed_s`` is per step that holds both a prefill chunk and decoding
    sequences (the module docstring). Profiles fitted before either existed load with 0.
    """

    c0_s: float
    c_prefill_s: float
    c_decode_s: float
    c_context_s: float = 0.0
    c_attention_s: float = 0.0
    c_mixed_s: float = 0.0

    def step_time_s(self, prefill_tokens: int, decode_seqs: int, context_tokens: int,
                    attention_pairs: float | None = None) -> float:
        """Seconds for one step (counts as in :meth:`RooflineCost.step_time_s`;
        ``attention_pairs`` None: one query per context token, no multi-token term)."""
        if prefill_tokens + decode_seqs <= 0:
            return 0.0
        return (
            self.c0_s
            + self.c_prefill_s * prefill_tokens
            + self.c_decode_s * decode_seqs
            + self.c_context_s * context_tokens
            + self.c_attention_s * extra_attention_pairs(context_tokens, attention_pairs)
            + (self.c_mixed_s if prefill_tokens > 0 and decode_seqs > 0 else 0.0)
        )


    def scaled(self, factor: float) -> "LinearStepCost":
        """The same profile with every step ``factor`` times as long (> 0), e.g. engines that
        get a smaller share of their cores than when they were calibrated.

        Raises:
            SimError: ``factor`` is not a positive finite number.
        """
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (math.isfinite(factor) and factor > 0):
            raise SimError(f"LinearStepCost.scaled: factor must be a positive number, got {factor!r}")
        return LinearStepCost(*(factor * getattr(self, f.name) for f in dataclasses.fields(self)))


def extra_attention_pairs(context_tokens: float, attention_pairs: float | None) -> float:
    """Query-key pairs beyond one query per context token (>= 0; 0 when ``attention_pairs`` is None)."""
    return 0.0 if attention_pairs is None else max(0.0, attention_pairs - context_tokens)


def prefill_attention_pairs(new_tokens: float, cached_tokens: float) -> float:
    """Query-key pairs of one prefill chunk of ``new_tokens`` after ``cached_tokens``
    computed ones: n*c + n(n+1)/2 (each new token attends the cache and the chunk up to itself)."""
    return new_tokens * cached_tokens + new_tokens * (new_tokens + 1) / 2


@dataclass(frozen=True)
class StepSample:
    """One measured engine step (or a run of identical steps, or the mean step of an interval
    of a live run): its batch (tokens, sequences; means may be fractional) and its time (s).

    ``attention_pairs``: the step's query-key pairs when known (a timed prefill of known
    cached and new tokens); None: unknown or one query per context token (decode steps, the
    mean step of a live interval), and the sample says nothing of ``c_attention_s``.
    ``mixed_steps``: the share of its steps that hold both a prefill chunk and decoding
    sequences (0 or 1 for one timed step); None: unknown (the mean step of a live interval),
    and a fit that includes such a sample leaves ``c_mixed_s`` at 0.
    """

    prefill_tokens: float
    decode_seqs: float
    context_tokens: float
    step_time_s: float
    attention_pairs: float | None = None
    mixed_steps: float | None = None

    @classmethod
    def from_saved(cls, d: dict) -> "StepSample":
        """A sample from its saved dict. Samples saved before ``attention_pairs`` existed
        get it back where their shape fixes it: a prefill-only sample (no decode
        sequences) was one chunk of ``prefill_tokens`` after ``context_tokens -
        prefill_tokens`` cached (how :mod:`router.sim.calibrate` timed them). Samples saved
        before ``mixed_steps`` existed get 0 where they were prefill-only or decode-only
        (no step of theirs mixed the two) and stay unknown otherwise.

        Raises:
            KeyError, TypeError: ``d`` lacks a field or has an unknown one.
        """
        s = cls(**d)
        if s.attention_pairs is None and "attention_pairs" not in d and s.decode_seqs == 0 and s.prefill_tokens > 0:
            s = dataclasses.replace(s, attention_pairs=prefill_attention_pairs(
                s.prefill_tokens, max(0.0, s.context_tokens - s.prefill_tokens)))
        if "mixed_steps" not in d and (s.prefill_tokens == 0 or s.decode_seqs == 0):
            s = dataclasses.replace(s, mixed_steps=0.0)
        return s


def fit_linear_step_cost(samples: list[StepSample], fit_context: bool = True) -> LinearStepCost:
    """Least-squares fit of :class:`LinearStepCost` to measured steps, in relative error.

    Args:
        samples: at least as many measured steps as fitted terms: c0, c_prefill, c_decode,
            c_context with ``fit_context``, and c_attention when some sample knows its
            ``attention_pairs`` and there is one sample more than the other terms need
            (otherwise it is 0: interval means and decode steps say nothing of it; a
            calibration saved with two decode shapes and two prefills fits as before);
            c_mixed when every sample knows its ``mixed_steps``, some are > 0 and there is
            a sample for it too (otherwise 0: a calibration without mixed shapes, or the
            means of live intervals).
        fit_context: also fit the per-context-token term; without it c_context is 0.

    Each sample's residual is divided by its measured time (minimises the sum of squared
    relative errors): measured steps span 30 ms decodes to 2 s prefills, and an absolute
    fit lets the prefills decide everything (it once fitted c0 = 0 and a 1-sequence decode
    7x too fast). Coefficients are constrained to be >= 0 by refitting without any that
    come out negative (a negative cost per token would make long batches faster).

    Raises:
        SimError: too few samples, or a non-positive step time.
    """
    cols = ["c0_s", "c_prefill_s", "c_decode_s"] + (["c_context_s"] if fit_context else [])
    # the attention term only when some sample knows its pairs and there is a sample for it
    fit_attention = any(s.attention_pairs is not None for s in samples) and len(samples) > len(cols)
    cols += ["c_attention_s"] if fit_attention else []
    fit_mixed = (all(s.mixed_steps is not None for s in samples) and any(s.mixed_steps > 0 for s in samples)
                 and len(samples) > len(cols))
    cols += ["c_mixed_s"] if fit_mixed else []
    if len(samples) < len(cols):
        raise SimError(f"fit_linear_step_cost needs at least {len(cols)} samples, got {len(samples)}")
    if any(s.step_time_s <= 0 for s in samples):
        raise SimError("fit_linear_step_cost: every sample needs step_time_s > 0")
    x_all = np.array(
        [[1.0, s.prefill_tokens, s.decode_seqs] + ([s.context_tokens] if fit_context else [])
         + ([extra_attention_pairs(s.context_tokens, s.attention_pairs)] if fit_attention else [])
         + ([s.mixed_steps] if fit_mixed else [])
         for s in samples], dtype=float)
    y = np.array([s.step_time_s for s in samples], dtype=float)
    x_rel, y_rel = x_all / y[:, None], np.ones_like(y)  # (x @ c - y) / y
    keep = list(range(len(cols)))
    while True:
        coef, *_ = np.linalg.lstsq(x_rel[:, keep], y_rel, rcond=None)
        if (coef >= 0).all() or len(keep) == 1:
            break
        keep.pop(int(np.argmin(coef)))
    values = dict.fromkeys(cols, 0.0)
    for j, c in zip(keep, coef):
        values[cols[j]] = float(max(c, 0.0))
    return LinearStepCost(**values)


def cpu_smollm2_samples() -> list[StepSample]:
    """Steps implied by the real-vLLM CPU measurements (shared/notes/vllm-cpu.md, 1 core compiled).

    - 1 stream, 128-token outputs: 11.5 tok/s -> one decode step of 1 sequence = 1/11.5 s.
    - 16 streams: 79.5 tok/s -> one step of 16 sequences = 16/79.5 s.
    - 1,000-token prompt, cold: TTFT 5.08 s (1,000 prefill tokens).
    - the same prompt again: 896 tokens hit, TTFT 0.65 s (104 prefill tokens over 1,000 of context).
    Decode contexts are taken at mid-output (prompt ~30 + 64 tokens).
    """
    return [
        StepSample(0, 1, 94, 1 / 11.5),
        StepSample(0, 16, 16 * 94, 16 / 79.5),
        StepSample(1000, 0, 1000, 5.08),
        StepSample(104, 0, 1000, 0.65),
    ]


def cpu_smollm2_cost() -> LinearStepCost:
    """The first CPU profile: SmolLM2-135M fp32 on one core, fitted to :func:`cpu_smollm2_samples`."""
    return fit_linear_step_cost(cpu_smollm2_samples())


def decode_ceiling(cost, kv_tokens: int, mean_context_tokens: float, max_num_seqs: int) -> tuple[float, int]:
    """The most tokens per second one engine can decode at a given mean context per decode
    token, with every step a decode step whose sequences fill the KV cache.

    A decode step of B sequences reads their contexts, about B x ``mean_context_tokens``
    tokens of KV, which the cache bounds: B <= ``kv_tokens`` / ``mean_context_tokens`` (and
    ``max_num_seqs``). The rate is max over such B of B / ``cost.step_time_s(0, B, B x
    mean_context)``: no prefill, no preemption, no idle step, the whole cache in use. Both
    cost models give a step time linear in context at a fixed batch and the rate rises with
    B, so for a trace whose decode tokens have this mean context (a property of the trace
    over a long window, not of the router) it bounds what any admission or placement can
    decode per engine: the steps must together read every decode token's context, each
    step at most ``kv_tokens`` of it. For a MoE roofline the weights a step reads grow with
    its batch, so a schedule of small steps over long contexts could beat it slightly; at
    the simulated replicas' batches (60+ sequences) a step reads 97% or more of the experts
    either way.

    Args:
        cost: a step-cost model, :class:`RooflineCost` or :class:`LinearStepCost` (anything with
            ``step_time_s(prefill_tokens, decode_seqs, context_tokens) -> seconds``).
        kv_tokens: KV blocks x block size of the engine (tokens).
        mean_context_tokens: mean context per decode token (tokens, > 0).
        max_num_seqs: the engine's most running sequences (sequences, >= 1).

    Returns:
        (tokens per second, the batch B that reaches it, in sequences).

    Raises:
        SimError: ``kv_tokens``, ``mean_context_tokens`` or ``max_num_seqs`` not positive, or a
            cost model that gives a decode step no time.
    """
    if not (kv_tokens > 0 and mean_context_tokens > 0 and max_num_seqs >= 1):
        raise SimError(f"decode_ceiling needs kv_tokens, mean_context_tokens > 0 and max_num_seqs >= 1, got "
                       f"{kv_tokens}, {mean_context_tokens}, {max_num_seqs}")
    top = max(1, min(max_num_seqs, int(kv_tokens // mean_context_tokens)))
    best, best_b = 0.0, 1
    for b in range(1, top + 1):
        step_s = cost.step_time_s(0, b, int(round(b * mean_context_tokens)))
        if not step_s > 0:
            raise SimError(f"decode_ceiling: the step-cost model gives a decode step of {b} sequences "
                           f"{step_s!r} s; it needs a positive time")
        rate = b / step_s
        if rate > best:
            best, best_b = rate, b
    return best, best_b


def kv_blocks_for(model: ModelShape, hardware: HardwareProfile, tp: int, block_size: int,
                  gpu_memory_utilization: float = 0.9) -> int:
    """KV blocks one replica holds: (tp * mem * util - weights) / (block_size * kv bytes per token).

    Raises:
        SimError: the weights do not fit in the replica's memory.
    """
    free = tp * hardware.mem_bytes * gpu_memory_utilization - model.total_params * model.bytes_per_param
    if free <= 0:
        raise SimError(
            f"model {model.name} ({model.total_params:.3g} params) does not fit on {tp} x {hardware.name}; "
            "raise tp or choose a smaller model"
        )
    return int(math.floor(free / (block_size * model.kv_bytes_per_token)))
