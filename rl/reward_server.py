"""The rlhf reward model in its own process: a small aiohttp server.

    python -m rl.reward_server [trainer.rewards.rlhf_scorer=reward_model
                                trainer.rewards.reward_model_path=/path/to/rm]
                               [trainer.rewards.server.port=8601]

It loads the scorer of ``trainer.rewards`` (a HF sequence-classification reward model,
or the zero-shot judge on the policy model) once and answers:

- ``POST /score`` ``{"items": [{"messages": [...], "completion": "..."}, ...]}`` ->
  ``{"scores": [float, ...]}`` (one per item, in order);
- ``GET /health`` -> 200 once the model is loaded.

The trainer talks to it through ``rl.rewards.HttpRewardScorer`` (``rlhf_scorer=http``).
Requests are scored one batch at a time, in a worker thread, so the event loop keeps
answering /health while a batch runs.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from common.config import EXIT_FAILURE, hydra_entry, register_user_error
from rl.data.base import Prompt
from rl.rewards import BatchScorer, RewardError, rlhf_scorer_from_config
from rollout.model import ModelBuildError, ModelPrepareError

register_user_error(RewardError, exit_code=EXIT_FAILURE)  # scoring at run time: exit 1
register_user_error(ModelPrepareError)  # a bad model.path: exit 2
register_user_error(ModelBuildError, exit_code=EXIT_FAILURE)  # the packaged model did not convert: exit 1


def _items_to_pairs(body: Any) -> tuple[list[Prompt], list[str]]:
    if not isinstance(body, dict) or not isinstance(body.get("items"), list):
        raise ValueError('body must be {"items": [{"messages": [...], "completion": "..."}]}')
    prompts, completions = [], []
    for i, it in enumerate(body["items"]):
        try:
            msgs = tuple({"role": str(m["role"]), "content": str(m["content"])}
                         for m in it["messages"])
            completions.append(str(it["completion"]))
        except (KeyError, TypeError):
            raise ValueError(f"items[{i}] needs messages (role/content) and completion") from None
        prompts.append(Prompt(f"item/{i}", "instructions", msgs))
    return prompts, completions


def make_app(scorer: BatchScorer) -> web.Application:
    """The aiohttp application serving ``scorer`` (see module docstring)."""
    lock = asyncio.Lock()

    async def score(request: web.Request) -> web.Response:
        try:
            prompts, completions = _items_to_pairs(await request.json())
        except (ValueError, json.JSONDecodeError) as e:
            return web.json_response({"error": str(e)}, status=400)
        async with lock:
            scores = await asyncio.to_thread(scorer.score_batch, prompts, completions)
        return web.json_response({"scores": [float(s) for s in scores]})

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/score", score)
    app.router.add_get("/health", health)
    return app


@hydra_entry("train")
def main(cfg) -> None:
    """Load the configured rlhf scorer and serve it until interrupted."""
    from rollout.model import resolve_model_path

    rcfg = cfg.trainer.rewards
    scorer = rlhf_scorer_from_config(rcfg, resolve_model_path(cfg.model), allow_http=False)
    print(f"reward server on http://{rcfg.server.host}:{rcfg.server.port} "
          f"({rcfg.rlhf_scorer})", flush=True)
    web.run_app(make_app(scorer), host=str(rcfg.server.host), port=int(rcfg.server.port),
                print=None)


if __name__ == "__main__":
    main()
