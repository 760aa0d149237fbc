"""The RL loop: trainer, learner, rewards, data and the ``rl.train`` / ``rl.compare`` / ``rl.eval`` commands.

Importing the package sets ``OMP_WAIT_POLICY=PASSIVE`` (unless the environment gives it): on
a CPU run the learner and the reward model share the machine's cores with the rollout
engines, and GNU OpenMP's default lets a thread that waits for its team spin on a core
another process needs. It must be set before torch loads its OpenMP runtime, and every
``rl`` command imports this package first; the processes it starts inherit it (the CPU
engines too, whose model runs one OpenMP thread per core it is bound to: one on the default
recipe, so no team waits there; for engines bound to several cores the effect is not
measured, and an exported ``OMP_WAIT_POLICY=ACTIVE`` restores the default everywhere). Measured
(``runs/`` probe of stop 44, one GRPO step of 16 x 224 tokens on the 2-core machine, torch 2
threads): beside two busy one-thread processes pinned one per core (as the two CPU engines
are) 80.5 s spinning, 57.4 s passive; on an idle machine 22.2 s and 23.3 s.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
