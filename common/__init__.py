"""The bottom floor: what every part's entry point and config shares, importing no part.

- ``common.config``: the one config system (Hydra groups under ``recipes/``), the entry
  point wrapper ``hydra_entry``, the exit codes, user errors, ``check_values``;
- ``common.options``: one mechanism that builds every options dataclass from a recipe
  section (unknown keys named with the valid ones, values checked against the fields'
  types);
- ``common.urls``: engine base URLs and KV-event endpoints, as every part takes them;
- ``common.process``: child processes started, health-checked and stopped by the job.

Why a package of its own and not ``recipes/`` as a package: ``recipes/`` holds YAML that
users copy and edit, and a Python package there would mix the config *values* with the
machinery that reads them; and why not inside one part (this code lived in ``rl/``,
``router/`` and ``rollout/``): then the router, the agent server and the serving stack,
each an entry point of its own, would import the trainer's package (or each other) for
their command line. Here every part stands on it and it stands on nothing of ours
(``tests/test_layering.py``, ``FLOORS``).
"""
