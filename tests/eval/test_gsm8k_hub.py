"""GSM8K from a JSONL path or, where no such path exists, a hub dataset id: the dispatch,
and the error offline or without ``datasets``. The hub is never reached: the loader
``rl.data.gsm8k.hub_dataset_rows`` is replaced."""

from __future__ import annotations

import json
import sys

import pytest

import rl.data.gsm8k as gsm8k
from common.config import compose
from rl.data import DataError, GSM8KSource
from rl.evaluation import EvalError, gsm8k_benchmark

ROWS = [{"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"},
        {"question": "What is 1,000 + 234?", "answer": "#### 1,234"}]


@pytest.fixture
def hub(monkeypatch):
    """The hub loader replaced: records each call and returns ``ROWS``."""
    calls = []

    def rows(dataset_id, config, split):
        calls.append((dataset_id, config, split))
        return ROWS

    monkeypatch.setattr(gsm8k, "hub_dataset_rows", rows)
    return calls


@pytest.mark.parametrize("spec,hub_id", [
    ("openai/gsm8k", True), ("gsm8k", True), ("my-org/gsm8k.v2", True),
    ("/data/gsm8k/test.jsonl", False), ("./gsm8k", False), ("../shared/data/gsm8k", False),
    ("~/gsm8k", False), ("a/b/c", False), ("test.jsonl", False), ("data.json", False),
])
def test_hub_ids_are_told_from_paths(spec, hub_id):
    assert gsm8k.looks_like_hub_id(spec) is hub_id


def test_hub_id_loads_through_datasets_with_config_and_split(hub):
    bench = gsm8k_benchmark("openai/gsm8k", split="test", hub_config="main")
    assert hub == [("openai/gsm8k", "main", "test")]
    assert [p.prompt_id for p in bench.prompts] == ["gsm8k/test/0", "gsm8k/test/1"]
    assert [p.reference for p in bench.prompts] == ["5", "1234"]


def test_existing_file_is_read_as_jsonl_without_the_hub(hub, tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n")
    assert len(gsm8k_benchmark(path).prompts) == 1
    assert len(gsm8k_benchmark(str(path)).prompts) == 1
    assert hub == []


def test_missing_path_is_a_missing_file_not_a_hub_lookup(hub, tmp_path):
    with pytest.raises(EvalError, match="does not exist"):
        gsm8k_benchmark(str(tmp_path / "gsm8k" / "test.jsonl"))
    with pytest.raises(EvalError, match="does not exist"):
        gsm8k_benchmark("./nope.jsonl")
    assert hub == []


def test_offline_hub_gives_a_clear_error_asking_for_a_jsonl_path(monkeypatch):
    def offline(*_args):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(gsm8k, "hub_dataset_rows", offline)
    with pytest.raises(EvalError) as e:
        gsm8k_benchmark("openai/gsm8k")
    msg = str(e.value)
    assert "openai/gsm8k" in msg and "ConnectionError" in msg and "JSONL path" in msg
    assert "eval.benchmarks.gsm8k.path" in msg


def test_without_the_datasets_library_the_error_says_to_install_it_or_pass_a_path(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(DataError, match=r"`datasets` library.*not installed.*JSONL path"):
        gsm8k.load_gsm8k_hub("openai/gsm8k")


def test_malformed_hub_row_names_the_row(monkeypatch):
    monkeypatch.setattr(gsm8k, "hub_dataset_rows", lambda *_a: [ROWS[0], {"question": "q"}])
    with pytest.raises(DataError, match="row 1"):
        gsm8k.load_gsm8k_hub("openai/gsm8k")


def test_training_source_takes_a_hub_id_with_its_split(hub):
    src = GSM8KSource("openai/gsm8k", split="train")
    assert hub == [("openai/gsm8k", "main", "train")] and len(src) == 2


def test_eval_config_with_a_hub_id_builds_the_benchmark_from_the_hub(hub):
    from rl.eval import single_turn_benchmarks

    cfg = compose("eval", ["run_dir=runs/test", "eval.benchmarks.gsm8k.path=openai/gsm8k",
                           "eval.benchmarks.gsm8k.limit=1", "eval.benchmarks.humaneval.enabled=false",
                           "eval.benchmarks.arithmetic.enabled=false"])
    [bench] = single_turn_benchmarks(cfg)
    assert hub == [("openai/gsm8k", "main", "test")] and len(bench.prompts) == 1
