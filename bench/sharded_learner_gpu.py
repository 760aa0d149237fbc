"""The sharded learner on a GPU machine with only torch installed (no vLLM, no
transformers needed): a sharded step of a small Llama-like model, the streamed weight
gather and a DCP checkpoint round trip, on 1 rank and (with several GPUs) on all of them,
in bf16 over NCCL. Under 10 minutes on one H200.

    python -m bench.sharded_learner_gpu [--layers 8 --hidden 1024 --vocab 32000 ...]

The options are ``bench/sharded_learner.py``'s but ``--device`` (always cuda here); the
defaults here are a ~0.2B model.
"""

from __future__ import annotations

import sys

import torch

from bench.sharded_learner import main

if __name__ == "__main__":
    if not torch.cuda.is_available() and not {"-h", "--help"} & set(sys.argv):
        sys.exit("bench.sharded_learner_gpu: torch sees no GPU here; "
                 "python -m bench.sharded_learner measures the CPU")
    n = torch.cuda.device_count()
    defaults = {"--layers": "8", "--hidden": "1024", "--vocab": "32000", "--batch": "16",
                "--tokens": "1024", "--bucket-mb": "64",
                "--ranks": ["1"] if n == 1 else ["1", str(n)]}
    for flag, value in defaults.items():
        if flag not in sys.argv:
            sys.argv += [flag, *([value] if isinstance(value, str) else value)]
    sys.exit(main(device="cuda", prog="python -m bench.sharded_learner_gpu",
                  description=__doc__.split("\n\n")[0].replace("\n", " ")))
