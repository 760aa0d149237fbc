"""Discrete-event simulator of a pool of vLLM-like engines driving the router's policies.

Entry point: ``python -m router.sim`` (Hydra config ``recipes/sim.yaml``). Library use::

    from router.policies import make_policy
    from router.sim import Simulation, SimConfig, generate_trace, WorkloadConfig
    result = Simulation(config, generate_trace(WorkloadConfig()), make_policy("misa_t")).run()

Importing this package registers the simulator's extra policies with the policy
registry: ``aimd``, ``tool_pause``, ``progress_ttl`` (admission anchors) and ``misa_t_oracle``.
"""

from __future__ import annotations

from router.policies import register_policy
from router.policies.aimd import AimdConfig, AimdPolicy
from router.policies.progress_ttl import ProgressTtlConfig, ProgressTtlPolicy
from router.policies.tool_pause import ToolPauseConfig, ToolPausePolicy
from router.sim.engine import Engine, EngineConfig, SimRequest
from router.sim.errors import SimError
from router.sim.oracle import MisaTOracleConfig, MisaTOraclePolicy
from router.sim.simulator import SignalConfig, SimConfig, SimResult, Simulation, WorkloadShift
from router.sim.trace import TraceRecord, TraceSession, TraceWriter, read_trace, write_trace
from router.sim.workload import WorkloadConfig, generate_trace

register_policy("aimd", AimdPolicy, AimdConfig)
register_policy("tool_pause", ToolPausePolicy, ToolPauseConfig)
register_policy("progress_ttl", ProgressTtlPolicy, ProgressTtlConfig)
register_policy("misa_t_oracle", MisaTOraclePolicy, MisaTOracleConfig)

__all__ = [
    "Engine", "EngineConfig", "SimRequest", "SimError", "SignalConfig", "SimConfig", "SimResult", "Simulation",
    "WorkloadShift", "TraceRecord", "TraceSession", "TraceWriter", "read_trace", "write_trace", "WorkloadConfig",
    "generate_trace",
]
