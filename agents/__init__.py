"""Agentic rollouts: the multi-turn agent loop, its tools, and the agent server.

- ``agents.server``: HTTP service (``python -m agents.server``) the trainer calls per unit.
- ``agents.client``: ``AgentServerClient`` and ``launch_agent_server``.
- ``agents.loop``: ``run_episode`` -> ``EpisodeResult`` (token trajectory, reward, timing).
- ``agents.chat`` / ``agents.toolcall`` / ``agents.tools``: the pieces of one turn (ChatML
  token ids, Hermes tool calls, sandboxed tools); model calls go through
  ``rollout.client.ModelClient`` (/v1/completions with the session headers).
- ``agents.envs``: SWE-style tasks (``task``), the bug-injecting builder (``build``,
  ``mutate``) and the committed hand-made tasks.
- ``agents.scripted``: a scripted OpenAI-compatible server (tests, benchmarks).
"""
