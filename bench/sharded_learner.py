"""Step time and peak memory per rank of the sharded learner (rl/sharded_learner.py,
FSDP2) on 1 and on 2 ranks, printed with their ratios, plus the weight gather and a
checkpoint round trip.

    python -m bench.sharded_learner [--ranks 1 2] [--device cpu] [--layers 4] [--hidden 256]
                                    [--vocab 4096] [--batch 8] [--tokens 128] [--steps 3]

For every rank count the ranks are started here as a launcher would (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT on 127.0.0.1; one process per rank, the same script). Rank 0
builds a Llama-like model (transformers' LlamaForCausalLM when transformers is
installed, else a torch-only one of the same shape: ``ToyLlama``), takes one warm-up step
(the optimizer state is allocated there) and ``--steps`` timed steps on one synthetic
batch, gathers the weights through the sync's streamed path (``weights_for_sync``) and
checks them tensor by tensor against DCP's full state dict (``ShardedLearner.full_state``;
the tied head against the embedding; names that differ stop the benchmark), then saves a
checkpoint and loads it back.
Only torch is needed (no vLLM, no safetensors), so ``bench/sharded_learner_gpu.py`` runs
it on a GPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parent.parent


class ToyLlama(torch.nn.Module):
    """A torch-only decoder with Llama's shape: tied embeddings, pre-RMSNorm blocks of
    causal self-attention and a SiLU-gated MLP. ``forward(input_ids [B, L],
    attention_mask [B, L])`` returns an object with ``.logits`` [B, L, vocab]."""

    def __init__(self, vocab: int, *, hidden: int, layers: int, heads: int):
        super().__init__()
        self.heads = heads
        self.embed_tokens = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList(_Block(hidden, heads) for _ in range(layers))
        self.norm = torch.nn.RMSNorm(hidden)
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids, attention_mask=None):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return SimpleNamespace(logits=self.lm_head(self.norm(x)))


class _Block(torch.nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.RMSNorm(hidden), torch.nn.RMSNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden, bias=False)
        self.o = torch.nn.Linear(hidden, hidden, bias=False)
        self.up = torch.nn.Linear(hidden, 2 * 4 * hidden, bias=False)
        self.down = torch.nn.Linear(4 * hidden, hidden, bias=False)

    def forward(self, x):
        B, L, H = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, L, 3, self.heads, H // self.heads).unbind(2)
        a = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, L, H))
        gate, up = self.up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(torch.nn.functional.silu(gate) * up)


def build_model(args) -> tuple[torch.nn.Module, str]:
    """The benchmark's model and its name (seeded: every rank builds the same weights)."""
    torch.manual_seed(0)
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return ToyLlama(args.vocab, hidden=args.hidden, layers=args.layers, heads=4), "ToyLlama (torch only)"
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                      num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=4,
                      tie_word_embeddings=True, pad_token_id=0, use_cache=False)
    return LlamaForCausalLM(cfg), "LlamaForCausalLM (transformers)"


def _samples(args):
    from rl.grpo import TrainSample

    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(args.batch):
        n = args.tokens // 2 + (i * args.tokens) // (2 * args.batch)  # uneven lengths
        ids = torch.randint(1, args.vocab, (n,), generator=g).tolist()
        p = n // 4
        out.append(TrainSample(ids[:p], ids[p:], [-5.0] * (n - p), 1.0 if i % 2 else -1.0))
    return out


def rank_main(args) -> int:
    """One rank of one measurement (the launcher's environment is set)."""
    from rl.distributed import RankGroup, rank_from_env, worker_loop
    from rl.learner import LearnerConfig
    from rl.sharded_learner import ShardedLearner

    info = rank_from_env()
    backend = "nccl" if args.device == "cuda" else "gloo"
    group = RankGroup(info, backend, collective_timeout_s=600)
    cfg = LearnerConfig(device=args.device, lr=1e-5, micro_batch_size=2, sync_bucket_mb=args.bucket_mb,
                        dtype="float32" if args.device == "cpu" else "bfloat16")

    def build(g, _path, c):
        model, _ = build_model(args)
        return ShardedLearner(g, None, c, module=model.to(getattr(torch, c.dtype)), pad_token_id=0)

    if info.rank > 0:
        return worker_loop(group, build)
    group.post("build", None, cfg)
    learner = build(group, None, cfg)
    samples = _samples(args)
    out: dict = {"model": build_model(args)[1], "ranks": info.world_size,
                 "params": sum(p.numel() for p in learner.model.parameters())}
    try:
        learner.step(samples)  # warm-up: AdamW state allocated here
        steps = [learner.step(samples) for _ in range(args.steps)]
        out["step_s"] = statistics.median(s["step_s"] for s in steps)
        out["peak_mem_gib"] = [steps[-1][f"peak_mem_gib_rank{r}"] for r in range(info.world_size)]
        out["optimizer_mib"] = [steps[-1][f"optimizer_state_mib_rank{r}"] for r in range(info.world_size)]
        reference = learner.full_state()["model"]  # DCP's own gather, to check the sync's
        t0 = time.perf_counter()
        n_bytes, names, unequal = 0, [], []
        for name, t in learner.weights_for_sync(to_cpu=False).items():
            full = t.to(learner.device)
            n_bytes += full.numel() * full.element_size()
            names.append(name)
            if name not in reference and name.endswith("lm_head.weight"):  # tied: DCP keeps one
                name_in_ref = name.replace("lm_head.weight", "embed_tokens.weight")
                name_in_ref = name_in_ref if name_in_ref in reference else "model.embed_tokens.weight"
            else:
                name_in_ref = name
            if name_in_ref not in reference or not torch.equal(full.cpu(), reference[name_in_ref]):
                unequal.append(name)
        out["gather_s"] = time.perf_counter() - t0  # (includes the check's copies to the CPU)
        out["gather_unequal"] = unequal
        out["gather_gib"] = n_bytes / 2**30
        out["gather_peak_mem_gib"] = [learner.last_sync_stats[f"peak_mem_gib_rank{r}"]
                                      for r in range(info.world_size)]
        out["gathered_tensors"] = len(names)
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            learner.save_checkpoint(Path(tmp) / "ckpt", extra={"bench": True})
            out["checkpoint_save_s"] = time.perf_counter() - t0
            before = learner.step(samples)["loss"]
            t0 = time.perf_counter()
            learner.load_checkpoint(Path(tmp) / "ckpt")
            out["checkpoint_load_s"] = time.perf_counter() - t0
            after = learner.step(samples)["loss"]  # the same step again from the restored state
            out["checkpoint_round_trip_loss_diff"] = abs(after - before)
    finally:
        learner.close()
    Path(args.out).write_text(json.dumps(out))
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(args, ranks: int) -> dict:
    """Start ``ranks`` processes of this script and return rank 0's figures."""
    with tempfile.TemporaryDirectory(prefix="sharded-bench-") as tmp:  # removed on any exit
        return _measure_in(args, ranks, Path(tmp) / "out.json")


def _measure_in(args, ranks: int, out: Path) -> dict:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "WORLD_SIZE": str(ranks),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // ranks))}
    argv = [sys.executable, "-m", "bench.sharded_learner", "--rank-of-run", "--out", str(out),
            "--device", args.device, *sys.argv[1:]]
    procs = [subprocess.Popen(argv, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, cwd=REPO)
             for r in range(ranks)]
    try:
        codes = [p.wait(timeout=args.timeout_s) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(codes):
        raise SystemExit(f"{ranks} rank(s): exit codes {codes}")
    res = json.loads(out.read_text())
    if res["gather_unequal"]:
        raise SystemExit(f"{ranks} rank(s): the sync's gathered {', '.join(res['gather_unequal'])} "
                         "differ from DCP's full state dict")
    return res


def report(results: list[dict]) -> None:
    """Print the figures of each rank count and their ratios to the first."""
    base = results[0]
    print(f"model: {base['model']}, {base['params'] / 1e6:.1f}M parameters")
    print(f"{'ranks':>5} {'step s':>8} {'x':>6} {'peak GiB/rank (max)':>20} {'x':>6} "
          f"{'AdamW MiB/rank (max)':>21} {'x':>6} {'gather s':>9} {'ckpt save/load s':>17} {'resume dLoss':>12}")
    for r in results:
        pk, op = max(r["peak_mem_gib"]), max(r["optimizer_mib"])
        print(f"{r['ranks']:>5} {r['step_s']:>8.3f} {r['step_s'] / base['step_s']:>6.2f} {pk:>20.3f} "
              f"{pk / max(base['peak_mem_gib']):>6.2f} {op:>21.1f} {op / max(base['optimizer_mib']):>6.2f} "
              f"{r['gather_s']:>9.3f} {r['checkpoint_save_s']:>8.2f}/{r['checkpoint_load_s']:<8.2f} "
              f"{r['checkpoint_round_trip_loss_diff']:>12.2e}")
    for r in results:
        print(f"ranks={r['ranks']}: peak GiB per rank {['%.3f' % x for x in r['peak_mem_gib']]}, "
              f"gather peak GiB per rank {['%.3f' % x for x in r['gather_peak_mem_gib']]}, "
              f"{r['gathered_tensors']} tensors / {r['gather_gib']:.3f} GiB gathered, "
              "equal to DCP's full state dict")


def parse_args(argv=None, device: str | None = None, prog: str = "python -m bench.sharded_learner",
               description: str | None = None):
    """The options; ``device`` None offers ``--device`` (default cpu), a device name fixes it
    (no option: ``bench/sharded_learner_gpu.py`` runs on cuda only). ``prog`` and
    ``description`` name the command in ``--help``."""
    # plain argparse (the GPU machine has torch only), options matched by whole name as CommandParser's
    ap = argparse.ArgumentParser(prog=prog, description=description or __doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    if device is None:
        ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    else:
        ap.set_defaults(device=device)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128, help="longest sample, tokens")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--bucket-mb", type=float, default=4.0)
    ap.add_argument("--timeout-s", type=float, default=540)
    ap.add_argument("--rank-of-run", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if any(r < 1 for r in args.ranks):
        ap.error(f"--ranks: every rank count must be >= 1, got {args.ranks}")
    return args


def main(device: str | None = None, prog: str = "python -m bench.sharded_learner",
         description: str | None = None) -> int:
    """Run the benchmark; ``device``, ``prog``, ``description``: as in :func:`parse_args`."""
    args = parse_args(device=device, prog=prog, description=description)
    if args.rank_of_run:
        return rank_main(args)
    report([measure(args, n) for n in args.ranks])
    return 0


if __name__ == "__main__":
    sys.exit(main())
