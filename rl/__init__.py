"""The RL loop: trainer, learner, rewards, data and the ``rl.train`` / ``rl.compare`` / ``rl.eval`` commands.

Importing the package sets ``OMP_WAIT_POLICY=PASSIVE`` (unless the environment gives it): on
a CPU run the learner and the reward model share the machine's cores with the rollout
engines, and GNU OpenMP's default lets a thread that waits for its team spin on a core
another process needs. It must be set before torch loads its OpenMP runtime, and every
``rl`` command imports this package first; the processes it starts inherit it (the CPU
engines too, whose model runs one OpenMP thread per core it is bound to: one on the default
recipe, so no team waits there; for engines bound to several cores the effect is not
measured, and an exported ``OMP_WAIT_POLICY=ACTIVE`` restores the default everywhere).
``python -m bench.omp_wait_policy`` on the 2-core machine (one GRPO step of 8 x 224 tokens,
median of 2): beside two busy one-thread processes pinned one per core, as the CPU engines
are, 39.0 s spinning and 30.8 s passive (0.79x); idle 10.7 s and 11.2 s (1.06x). End to end
on the default recipe (README, "Which router to pick") the first iteration was a quarter
shorter with it.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
