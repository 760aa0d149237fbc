"""Simulator speed and memory on the paper-sized trace (~75,000 requests in 2,466 sessions).

Target (issue #4): one policy and seed in <= 30 s on one core and <= 2 GiB peak memory.
Each policy runs in its own fresh process (so its peak RSS is its own), one after the
other, on the step3.7-like cluster at scale 1, with the options ``recipes/sim.yaml`` gives
it (``policy_params``) and at the ceiling the Table 5 experiment gives it: the paper's
sweep-tuned 128 units for round_robin and cache_aware, the common permissive 512 for the
admission policies (where they hold the most requests). Printed side by side: trace
generation time, simulation wall and CPU time (CPU time is what one core spends, less
disturbed by other work on the machine than wall time), decide() calls, peak RSS, their
ratios to the targets, and each policy's CPU time relative to round_robin (whose
decisions cost nothing, so it measures the simulator alone).

    .venv/bin/python -m bench.sim_speed [policy ...] [--ceiling N]
    # default: round_robin cache_aware session_admission misa misa_t
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import time
from pathlib import Path

from omegaconf import OmegaConf

SWEEP_CEILING = 128  # the paper's sweep-tuned static ceiling for Step3.7 (section 5.1)
PERMISSIVE_CEILING = 512  # the admission policies' common ceiling (recipes/sim/step3.7-like.yaml)
ADMISSION = ("session_admission", "misa", "misa_t", "misa_t_oracle", "aimd", "tool_pause")
TARGET_S = 30.0
TARGET_MIB = 2048.0
RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "sim.yaml"


def _one(policy: str, ceiling: int, queue) -> None:
    import router.sim  # noqa: F401
    from router.policies import make_policy
    from router.sim.experiments import ClusterSpec, RunSpec, build_sim_config
    from router.sim.simulator import Simulation
    from router.sim.workload import WorkloadConfig, generate_trace

    recipe = OmegaConf.to_container(OmegaConf.load(RECIPE), resolve=False)
    params = dict(recipe["policy_params"].get(policy) or {})
    t0 = time.perf_counter()
    sessions = generate_trace(WorkloadConfig(seed=0))
    t1 = time.perf_counter()
    cluster = ClusterSpec("step3.7-like", "step3.7-like", "H200", 8, 2)
    spec = RunSpec("bench", cluster, policy, params, ceiling=ceiling, seed=0, scale=1.0,
                   engine=recipe["engine"], signals=recipe["signals"], mixture=recipe["mixture"])
    policy_obj = make_policy(policy, spec.params)
    calls = [0]
    decide = policy_obj.decide

    def counted(request, view, now):
        calls[0] += 1
        return decide(request, view, now)

    policy_obj.decide = counted
    sim = Simulation(build_sim_config(spec), sessions, policy_obj)
    c1 = time.process_time()
    result = sim.run()
    t2 = time.perf_counter()
    cpu_s = time.process_time() - c1
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    queue.put({"policy": policy, "ceiling": ceiling, "gen_s": t1 - t0, "sim_s": t2 - t1, "cpu_s": cpu_s,
               "peak_mib": peak_mib, "requests": result.summary["requests_finished"],
               "events": result.summary["events"], "decides": calls[0]})


def main() -> None:
    """Run each policy in a fresh process, one after the other, and print the table."""
    ap = argparse.ArgumentParser(prog="python -m bench.sim_speed", description=__doc__.split("\n\n")[0])
    ap.add_argument("policies", nargs="*",
                    default=["round_robin", "cache_aware", "session_admission", "misa", "misa_t"])
    ap.add_argument("--ceiling", type=int, default=None,
                    help="trainer ceiling for every policy (default: 128, or 512 for admission policies)")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    rows = []
    for policy in args.policies:
        ceiling = args.ceiling or (PERMISSIVE_CEILING if policy in ADMISSION else SWEEP_CEILING)
        q = ctx.Queue()
        p = ctx.Process(target=_one, args=(policy, ceiling, q))
        p.start()
        rows.append(q.get())
        p.join()
    base = next((r["cpu_s"] for r in rows if r["policy"] == "round_robin"), None)
    print(f"{'policy':<18}{'ceiling':>8}{'requests':>9}{'events':>10}{'decides':>9}{'trace s':>9}{'wall s':>8}"
          f"{'cpu s':>8}{'cpu/30 s':>9}{'peak MiB':>10}{'/2 GiB':>8}{'cpu x round_robin':>19}")
    for r in rows:
        rel = f"{r['cpu_s'] / base:.2f}" if base else "-"
        print(f"{r['policy']:<18}{r['ceiling']:>8}{r['requests']:>9}{r['events']:>10}{r['decides']:>9}"
              f"{r['gen_s']:>9.2f}{r['sim_s']:>8.1f}{r['cpu_s']:>8.1f}{r['cpu_s'] / TARGET_S:>9.2f}"
              f"{r['peak_mib']:>10.0f}{r['peak_mib'] / TARGET_MIB:>8.2f}{rel:>19}")


if __name__ == "__main__":
    main()
