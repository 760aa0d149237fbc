"""Simulator speed and memory on the paper-sized trace (~75,000 requests in 2,466 sessions).

Target (issue): one policy and seed in <= 30 s on one core and <= 2 GiB peak memory.
Each policy runs in its own fresh process (so its peak RSS is its own), one after the
other, on the step3.7-like cluster at scale 1 with the trainer ceiling at 128 units. Printed side by side: trace generation
time, simulation wall and CPU time (CPU time is what one core spends, unaffected by
other work on the machine), peak RSS, their ratios to the targets, and each policy's time
relative to round_robin (whose decisions cost nothing, so it measures the simulator alone).

    .venv/bin/python bench/sim_speed.py [policy ...]     # default: round_robin cache_aware misa_t
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import sys
import time

CEILING = 128  # the paper's sweep-tuned static ceiling for Step3.7 (section 5.1)
TARGET_S = 30.0
TARGET_MIB = 2048.0


def _one(policy: str, queue) -> None:
    import router.sim  # noqa: F401
    from router.policies import make_policy
    from router.sim.experiments import ClusterSpec, RunSpec, build_sim_config
    from router.sim.simulator import Simulation
    from router.sim.workload import WorkloadConfig, generate_trace

    t0 = time.perf_counter()
    sessions = generate_trace(WorkloadConfig(seed=0))
    t1 = time.perf_counter()
    cluster = ClusterSpec("step3.7-like", "step3.7-like", "H200", 8, 2)
    spec = RunSpec("bench", cluster, policy, {"match_from": "prefix_index"} if policy == "cache_aware" else {},
                   ceiling=CEILING, seed=0, scale=1.0,
                   engine={"block_size": 256, "max_num_batched_tokens": 8192, "max_num_seqs": 256},
                   signals={"metrics_delay_s": 0.5, "kv_event_delay_s": 0.1},
                   mixture={"agent": 48.6, "rlvr": 33.1, "rlhf": 18.2})
    sim = Simulation(build_sim_config(spec), sessions, make_policy(policy, spec.params))
    c1 = time.process_time()
    result = sim.run()
    t2 = time.perf_counter()
    cpu_s = time.process_time() - c1
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    queue.put({"policy": policy, "gen_s": t1 - t0, "sim_s": t2 - t1, "cpu_s": cpu_s, "peak_mib": peak_mib,
               "requests": result.summary["requests_finished"], "events": result.summary["events"]})


def main(policies: list[str]) -> None:
    ctx = mp.get_context("spawn")
    rows = []
    for policy in policies:
        q = ctx.Queue()
        p = ctx.Process(target=_one, args=(policy, q))
        p.start()
        rows.append(q.get())
        p.join()
    base = next((r["cpu_s"] for r in rows if r["policy"] == "round_robin"), None)
    print(f"{'policy':<18}{'requests':>9}{'events':>10}{'trace s':>9}{'wall s':>8}{'cpu s':>8}{'cpu/30 s':>9}"
          f"{'peak MiB':>10}{'/2 GiB':>8}{'cpu x round_robin':>19}")
    for r in rows:
        rel = f"{r['cpu_s'] / base:.2f}" if base else "-"
        print(f"{r['policy']:<18}{r['requests']:>9}{r['events']:>10}{r['gen_s']:>9.2f}{r['sim_s']:>8.1f}"
              f"{r['cpu_s']:>8.1f}{r['cpu_s'] / TARGET_S:>9.2f}{r['peak_mib']:>10.0f}{r['peak_mib'] / TARGET_MIB:>8.2f}"
              f"{rel:>19}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["round_robin", "cache_aware", "misa_t"])
