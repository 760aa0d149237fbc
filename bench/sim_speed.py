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

A policy that fails in its process (an error, or the process killed) ends the benchmark
with one ``bench.sim_speed failed: ...`` line and exit code 1, after the table of the
policies that finished; an unknown policy or a ceiling below 1 is refused before any
process starts (``error: ...``, exit code 2).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import resource
import sys
import time
import traceback
from pathlib import Path

from omegaconf import OmegaConf

from common.config import EXIT_FAILURE, usage_error, CommandParser

SWEEP_CEILING = 128  # the paper's sweep-tuned static ceiling for Step3.7 (section 5.1)
PERMISSIVE_CEILING = 512  # the admission policies' common ceiling (recipes/sim/step3.7-like.yaml)
ADMISSION = ("session_admission", "misa", "misa_t", "misa_t_oracle", "aimd", "tool_pause")
TARGET_S = 30.0
TARGET_MIB = 2048.0
RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "sim.yaml"
DEFAULT_POLICIES = ("round_robin", "cache_aware", "session_admission", "misa", "misa_t")


class ChildFailed(RuntimeError):
    """A policy's process raised, or exited without a result (the message says which)."""


def _one(policy: str, ceiling: int, out) -> None:
    """The child: measure ``policy`` and put its row on the queue ``out``; an exception is put
    there as ``{"error": "<type>: <message> (at <file>:<line>)"}`` instead of a traceback."""
    try:
        out.put(_measure(policy, ceiling))
    except Exception as e:  # noqa: BLE001 -- reported by the parent as one line
        where = traceback.extract_tb(e.__traceback__)[-1]
        first = (str(e).splitlines() or [""])[0]
        out.put({"error": f"{type(e).__name__}: {first} (at {Path(where.filename).name}:{where.lineno})"})


def _measure(policy: str, ceiling: int) -> dict:
    import router.sim  # noqa: F401
    from router.policies import make_policy
    from router.sim.experiments import ClusterSpec, RunSpec, build_sim_config
    from router.sim.simulator import Simulation
    from router.sim.workload import WorkloadConfig, generate_trace

    recipe = OmegaConf.to_container(OmegaConf.load(RECIPE), resolve=False)
    params = dict(recipe["policy_params"].get(policy) or {})
    cluster = ClusterSpec("step3.7-like", "step3.7-like", "H200", 8, 2)
    spec = RunSpec("bench", cluster, policy, params, ceiling=ceiling, seed=0, scale=1.0,
                   engine=recipe["engine"], signals=recipe["signals"], mixture=recipe["mixture"])
    policy_obj = make_policy(policy, spec.params)  # a policy that cannot be built fails before the trace
    t0 = time.perf_counter()
    sessions = generate_trace(WorkloadConfig(seed=0))
    t1 = time.perf_counter()
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
    return {"policy": policy, "ceiling": ceiling, "gen_s": t1 - t0, "sim_s": t2 - t1, "cpu_s": cpu_s,
            "peak_mib": peak_mib, "requests": result.summary["requests_finished"],
            "events": result.summary["events"], "decides": calls[0]}


def run_in_child(ctx, policy: str, ceiling: int, target=_one, poll_s: float = 1.0) -> dict:
    """Run ``target(policy, ceiling, queue)`` in a fresh process of ``ctx`` and return the row
    it puts on the queue. Never waits on a dead process: the queue is polled every
    ``poll_s`` seconds while the process lives.

    Raises:
        ChildFailed: the child reported an error, or exited without a result (its exit code
            or signal in the message).
    """
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(policy, ceiling, q), daemon=True)
    p.start()
    try:
        while True:
            try:
                row = q.get(timeout=poll_s)
                break
            except queue.Empty:
                if p.is_alive():
                    continue
            try:  # it may have put its row just before it exited
                row = q.get(timeout=poll_s)
                break
            except queue.Empty:
                how = (f"was killed by signal {-p.exitcode}" if p.exitcode is not None and p.exitcode < 0
                       else f"exited with code {p.exitcode}")
                raise ChildFailed(f"policy {policy}: its process {how} without a result") from None
    finally:
        p.join(timeout=30)
        if p.is_alive():  # interrupted, or stuck after reporting
            p.kill()
            p.join()
        q.close()
        q.join_thread()
    if "error" in row:
        raise ChildFailed(f"policy {policy}: {row['error']}")
    return row


def _policies(names: list[str]) -> list[str]:
    """The policy names as the registry spells them; an unknown one is a usage error."""
    import router.sim  # noqa: F401  (registers the simulator's own policies)
    from router.policies import canonical_policy_name, registered_policy_names

    valid = registered_policy_names()
    policies = [canonical_policy_name(n) for n in names]
    unknown = [n for n, c in zip(names, policies) if c not in valid]
    if unknown:
        raise usage_error(f"unknown policy {', '.join(map(repr, unknown))}; valid: {', '.join(valid)}")
    return policies


def main() -> None:
    """Run each policy in a fresh process, one after the other, and print the table."""
    ap = CommandParser(prog="python -m bench.sim_speed", description=__doc__.split("\n\n")[0])
    ap.add_argument("policies", nargs="*", default=list(DEFAULT_POLICIES))
    ap.add_argument("--ceiling", type=int, default=None,
                    help="trainer ceiling for every policy (default: 128, or 512 for admission policies)")
    args = ap.parse_args()
    if args.ceiling is not None and args.ceiling < 1:
        raise usage_error(f"--ceiling must be a positive integer (units in flight), got {args.ceiling}")
    policies = _policies(args.policies)
    ctx = mp.get_context("spawn")
    rows = []
    failed = None
    for policy in policies:
        ceiling = args.ceiling or (PERMISSIVE_CEILING if policy in ADMISSION else SWEEP_CEILING)
        try:
            rows.append(run_in_child(ctx, policy, ceiling))
        except ChildFailed as e:
            failed = e
            break
    if rows:
        _print_table(rows)
    if failed is not None:
        print(f"bench.sim_speed failed: {failed}", file=sys.stderr)
        raise SystemExit(EXIT_FAILURE)


def _print_table(rows: list[dict]) -> None:
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
