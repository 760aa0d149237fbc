import pytest

from agents.envs.task import load_tasks
from agents.scripted import ScriptedServer, gold_patch_policy
from agents.server import HANDMADE_TASKS


@pytest.fixture
def handmade_tasks():
    return load_tasks(HANDMADE_TASKS)


@pytest.fixture
async def scripted_server(handmade_tasks):
    """A scripted OpenAI-compatible server whose policy fixes the hand-made tasks."""
    server = ScriptedServer(gold_patch_policy({t.problem_statement: t.patch
                                               for t in handmade_tasks.values()}))
    runner, url = await server.start()
    server.url = url
    yield server
    await runner.cleanup()


@pytest.fixture
async def model_base_url(scripted_server):
    """Base URL of an OpenAI-compatible model endpoint (here: the scripted server)."""
    return scripted_server.url
