"""Build SWE-style tasks from real Python projects by injecting bugs (SWE-smith style).

    python -m agents.envs.build [num_tasks=240] [seed=0] [out_dir=...] [workers=2]

For each project in ``recipes/agents/build_tasks.yaml``: fetch its source distribution
(``pip download --no-binary :all: --no-deps``, cached), run its tests once in the
sandbox to learn which pass, then try AST mutations (``agents/envs/mutate.py``) of the
functions its tests name. A mutant is kept when 1-10 of the relevant tests fail; those
become FAIL_TO_PASS, relevant tests that still pass become PASS_TO_PASS, and the problem
statement is written from the failures. Only the tests that name the mutated function are
run per mutant (seconds, not the whole suite), ``workers`` at once.

Output in ``out_dir``: ``tasks.jsonl`` (SWE-bench instances), ``snapshots/<instance_id>/``
(the buggy repository each episode starts from), ``build_report.json`` (counts, time).
The result is a function of the seed, the projects' versions and the config.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig
from tqdm import tqdm

from agents.envs.mutate import OPERATORS, Mutation, apply_mutation, enumerate_mutations
from agents.envs.task import Task, TaskError, evaluate, run_tests, write_tasks
from common.config import (EXIT_FAILURE, SEED_RULE, ConfigError, Rule, check_values, hydra_entry, is_text,
                           number, or_null, register_user_error)
from sandbox import IsolationConfig, Limits, SandboxError, Workspace, unified_diff


class BuildError(RuntimeError):
    """Task building failed (download, unpacking, a project's clean tests); the message says
    which project and what to do."""


@dataclass(frozen=True)
class Project:
    """One source project (``recipes/agents/build_tasks.yaml`` entry).

    Attributes:
        name: PyPI name.
        version: pinned version (the snapshot's ``base_commit``).
        source: package folder or module file(s) mutated, relative to the sdist root.
        tests: test folder or file, relative to the sdist root.
        keep: what of the sdist goes into snapshots (besides ``source`` and ``tests``).
    """

    name: str
    version: str
    source: tuple[str, ...]
    tests: str
    keep: tuple[str, ...] = ()

    @property
    def slug(self) -> str:
        return re.sub(r"[^a-z0-9]+", "_", self.name.lower())


# ---------------------------------------------------------------------------- fetching


def fetch_project(p: Project, cache_dir: Path) -> Path:
    """Download and unpack ``p``'s sdist once; returns the clean project folder.

    Only ``source``, ``tests`` and ``keep`` paths are kept (no docs, no egg-info).

    Raises:
        BuildError: pip could not download it, or a configured path is not in the sdist.
    """
    clean = cache_dir / "projects" / f"{p.slug}-{p.version}"
    if clean.is_dir():
        return clean
    sdists = cache_dir / "sdists"
    sdists.mkdir(parents=True, exist_ok=True)
    archives = list(sdists.glob(f"{p.name.replace('-', '[-_]')}-{p.version}.tar.gz"))
    if not archives:
        cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
               f"{p.name}=={p.version}", "-d", str(sdists)]
        # pip's own temporary folders go into one of ours, removed also when the build is
        # stopped (Ctrl-C, SIGTERM), instead of being left in /tmp.
        pip_tmp = tempfile.mkdtemp(prefix=".pip-tmp-", dir=sdists)
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TMPDIR": pip_tmp})
        finally:
            shutil.rmtree(pip_tmp, ignore_errors=True)
        archives = list(sdists.glob(f"{p.name.replace('-', '[-_]')}-{p.version}.tar.gz"))
        if r.returncode != 0 or not archives:
            raise BuildError(f"could not download the sdist of {p.name}=={p.version} "
                             f"(pip said: {r.stderr.strip()[-500:]}); check the name/version "
                             "in recipes/agents/build_tasks.yaml and the package index.")
    tmp = clean.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(archives[0]) as tar:
        tar.extractall(tmp, filter="data")
    (root,) = list(tmp.iterdir())
    staged = tmp / "clean"
    for rel in [*p.source, p.tests, *p.keep]:
        src = root / rel
        if not src.exists():
            shutil.rmtree(tmp)
            raise BuildError(f"{p.name} {p.version}: {rel!r} is not in the sdist; fix "
                             "source/tests/keep in recipes/agents/build_tasks.yaml.")
        dst = staged / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True)  # tests may lie inside source
        else:
            shutil.copy2(src, dst)
    staged.rename(clean)
    shutil.rmtree(tmp)
    return clean


# ---------------------------------------------------------------------------- tests


def test_identifiers(project_dir: Path, node_ids: list[str]) -> dict[str, set[str]]:
    """Node id -> identifiers its test code names (names and attributes, in the test
    function and its class; for a doctest item, the documented object's name)."""
    by_file: dict[str, dict[str, set[str]]] = {}
    out: dict[str, set[str]] = {}
    for node in node_ids:
        parts = node.split("[", 1)[0].split("::")
        file = parts[0]
        if file not in by_file:
            by_file[file] = _defs_identifiers(project_dir / file)
        scopes = by_file[file]
        names: set[str] = set()
        for scope in parts[1:]:
            names |= scopes.get(scope, set())
        if len(parts) == 2 and "." in parts[1]:  # doctest: pkg.mod.func
            names.add(parts[1].rsplit(".", 1)[-1])
        out[node] = names
    return out


def _defs_identifiers(path: Path) -> dict[str, set[str]]:
    """Top-level def/class name -> identifiers inside it (methods merged into their class,
    also listed by their own name)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return {}

    def idents(node: ast.AST) -> set[str]:
        return {n.id if isinstance(n, ast.Name) else n.attr
                for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))}

    out: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = idents(node)
            if isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        out[sub.name] = idents(sub) | out[node.name]
    return out


async def collect_passing(p: Project, clean: Path, cfg: DictConfig,
                          isolation: IsolationConfig) -> list[str]:
    """Node ids of ``p``'s tests that pass on the clean project (one full run).

    Raises:
        BuildError: no test passed (broken set-up: missing test dependency, ...).
    """
    limits = Limits(timeout_s=cfg.clean_run_timeout_s, cpu_s=int(cfg.clean_run_timeout_s),
                    output_bytes=64 * 1024)
    async with Workspace.create(clean, root=cfg.work_dir, isolation=isolation) as ws:
        report = await run_tests(ws, cfg.test_cmd, [p.tests], limits=limits)
    passing = sorted(k for k, v in report.outcomes.items() if v == "passed")
    if not passing:
        raise BuildError(f"{p.name}: no test passed on the clean project; output:\n"
                         f"{report.command.stdout[-1500:]}{report.command.stderr[-1500:]}")
    return passing


# ---------------------------------------------------------------------------- mutants


@dataclass(frozen=True)
class Candidate:
    """A mutation with the tests that name its function."""

    project: Project
    mutation: Mutation
    source: str
    relevant: tuple[str, ...]


def candidates(p: Project, clean: Path, passing: list[str], rng: random.Random,
               max_relevant: int, extra_same_file: int) -> list[Candidate]:
    """Mutations of functions that passing tests name, shuffled and interleaved by
    operator (so no operator dominates), deterministic given ``rng``'s seed."""
    idents = test_identifiers(clean, passing)
    tests_naming: dict[str, list[str]] = defaultdict(list)
    by_file: dict[str, list[str]] = defaultdict(list)
    for node, names in idents.items():
        by_file[node.split("::", 1)[0]].append(node)
        for n in names:
            tests_naming[n].append(node)

    salt = rng.random()

    def relevant_tests(name: str) -> tuple[str, ...]:
        # Tests naming the function, plus a few others from the same files so that a
        # task keeps PASS_TO_PASS tests even when every naming test fails.
        naming = sorted(tests_naming.get(name, []))[:max_relevant]
        if not naming:
            return ()
        files = sorted({t.split("::", 1)[0] for t in naming})
        others = sorted({t for f in files for t in by_file[f]} - set(naming))
        extra = random.Random(f"{salt}/{name}").sample(others, min(extra_same_file, len(others)))
        return tuple(sorted(set(naming) | set(extra)))

    files = sorted(f for s in p.source for f in ([clean / s] if (clean / s).is_file()
                                                  else (clean / s).rglob("*.py")))
    test_root = clean / p.tests
    by_op: dict[str, list[Candidate]] = defaultdict(list)
    for f in files:
        if test_root in f.parents or f == test_root:
            continue
        rel = str(f.relative_to(clean))
        source = f.read_text(encoding="utf-8")
        for m in enumerate_mutations(rel, source):
            relevant = relevant_tests(m.short_name)
            if relevant and not m.short_name.startswith("__"):
                by_op[m.operator].append(Candidate(p, m, source, relevant))
    for op in OPERATORS:
        rng.shuffle(by_op[op])
    out: list[Candidate] = []
    for i in range(max((len(v) for v in by_op.values()), default=0)):
        out += [by_op[op][i] for op in OPERATORS if i < len(by_op[op])]
    return out


def problem_statement(c: Candidate, failing: list[str], messages: dict[str, str],
                      hint_function: bool) -> str:
    """Issue text written from the failing tests (what a user would report)."""
    lines = [f"Some behaviour of {c.project.name} is broken: these tests fail.", ""]
    for node in failing:
        msg = messages.get(node, "")
        lines.append(f"- {node}" + (f": {msg}" if msg else ""))
    lines.append("")
    if hint_function:
        lines.append(f"The failures involve `{c.mutation.short_name}`.")
    lines.append("Fix the library code (not the tests) so that these tests pass and the "
                 "other tests keep passing.")
    return "\n".join(lines)


async def try_candidate(c: Candidate, clean: Path, cfg: DictConfig,
                        isolation: IsolationConfig) -> tuple[list[str], list[str], dict[str, str]] | None:
    """Run the candidate's relevant tests on the mutant: (failing, passing, messages), or
    None when the mutant does not compile or changes nothing."""
    try:
        mutated = apply_mutation(c.source, c.mutation)
        compile(mutated, c.mutation.path, "exec")
    except (SyntaxError, ValueError):
        return None
    if mutated == c.source:
        return None
    limits = Limits(timeout_s=cfg.mutant_timeout_s, cpu_s=int(cfg.mutant_timeout_s),
                    output_bytes=16 * 1024)
    async with Workspace.create(clean, root=cfg.work_dir, isolation=isolation) as ws:
        ws.write_text(c.mutation.path, mutated)
        report = await run_tests(ws, cfg.test_cmd, c.relevant, limits=limits)
    failing = [t for t in c.relevant if not report.passed(t)]
    passing = [t for t in c.relevant if report.passed(t)]
    return failing, passing, report.messages


def write_snapshot(c: Candidate, clean: Path, out_dir: Path, iid: str) -> tuple[Path, str]:
    """Copy the clean project with the mutant in place; returns (snapshot, gold patch)."""
    snap = out_dir / "snapshots" / iid
    shutil.rmtree(snap, ignore_errors=True)
    shutil.copytree(clean, snap)
    (snap / c.mutation.path).write_text(apply_mutation(c.source, c.mutation), encoding="utf-8")
    return snap, unified_diff(snap, clean)


async def verify_task(task: Task, cfg: DictConfig, isolation: IsolationConfig) -> bool:
    """True when the task scores 0 on its snapshot and 1 after its gold patch."""
    limits = Limits(timeout_s=cfg.mutant_timeout_s, cpu_s=int(cfg.mutant_timeout_s))
    async with Workspace.create(task.snapshot, root=cfg.work_dir, isolation=isolation) as ws:
        before, _ = await evaluate(ws, task, limits)
        await ws.apply_patch(task.patch)
        after, _ = await evaluate(ws, task, limits)
    return before == 0.0 and after == 1.0


# ---------------------------------------------------------------------------- build


def quotas(num_tasks: int, n_projects: int) -> list[int]:
    """Tasks per project: an even split of ``num_tasks`` (the first ones take the rest)."""
    base, extra = divmod(num_tasks, n_projects)
    return [base + (i < extra) for i in range(n_projects)]


async def build(cfg: DictConfig) -> dict:
    """Build the tasks; returns the build report (also written to out_dir).

    Raises:
        BuildError: a project could not be fetched or its clean tests do not pass.
    """
    started = time.monotonic()
    out_dir = Path(cfg.out_dir).expanduser()
    cache_dir = Path(cfg.cache_dir).expanduser()
    Path(cfg.work_dir).mkdir(parents=True, exist_ok=True) if cfg.work_dir else None
    isolation = IsolationConfig(unsafe_no_isolation=cfg.unsafe_no_isolation)
    projects = [Project(name=p.name, version=str(p.version), source=tuple(p.source),
                        tests=p.tests, keep=tuple(p.get("keep", []))) for p in cfg.projects]
    rng = random.Random(cfg.seed)
    plans = []
    for p in projects:
        clean = fetch_project(p, cache_dir)
        passing = await collect_passing(p, clean, cfg, isolation)
        cands = candidates(p, clean, passing, random.Random(rng.random()), cfg.max_relevant_tests,
                           cfg.extra_same_file_tests)
        plans.append((p, clean, passing, cands))
    # Projects with few candidates go first: what they cannot fill passes to the next.
    plans.sort(key=lambda plan: len(plan[3]))
    tasks: list[Task] = []
    report: dict = {"seed": cfg.seed, "projects": {}}
    shortfall = 0
    bar = tqdm(total=cfg.num_tasks, desc="tasks", unit="task")
    for (p, clean, passing, cands), quota in zip(plans, quotas(cfg.num_tasks, len(projects))):
        quota += shortfall  # a project that ran short passes its rest to the next
        kept: list[Task] = []
        per_function: Counter = Counter()
        tried = 0
        i = 0
        while len(kept) < quota and i < len(cands):
            batch = [c for c in cands[i:i + cfg.workers * 2]]
            i += len(batch)
            batch = [c for c in batch if per_function[(c.mutation.path, c.mutation.function)]
                     < cfg.max_per_function]
            results = await asyncio.gather(*(try_candidate(c, clean, cfg, isolation) for c in batch))
            tried += len(batch)
            for c, res in zip(batch, results):  # in candidate order: deterministic
                if res is None or len(kept) >= quota:
                    continue
                failing, still_passing, messages = res
                key = (c.mutation.path, c.mutation.function)
                if not (cfg.min_failing <= len(failing) <= cfg.max_failing) \
                        or per_function[key] >= cfg.max_per_function:
                    continue
                per_function[key] += 1
                iid = f"{p.slug}__{c.mutation.short_name}-{c.mutation.operator}-{c.mutation.line}-{c.mutation.site}"
                snap, gold = write_snapshot(c, clean, out_dir, iid)
                p2p = still_passing
                if len(p2p) > cfg.max_pass_to_pass:
                    p2p = sorted(random.Random(f"{cfg.seed}/{iid}").sample(p2p, cfg.max_pass_to_pass))
                kept.append(Task(
                    instance_id=iid, repo=p.name, base_commit=f"{p.name}-{p.version}",
                    snapshot=str(snap), problem_statement=problem_statement(
                        c, failing, messages, cfg.hint_function),
                    FAIL_TO_PASS=tuple(failing), PASS_TO_PASS=tuple(p2p), test_cmd=cfg.test_cmd,
                    patch=gold, metadata={"operator": c.mutation.operator, "function": c.mutation.function,
                                          "path": c.mutation.path, "line": c.mutation.line,
                                          "seed": cfg.seed}))
                bar.update(1)
            bar.set_postfix(project=p.name, tried=tried)
        shortfall = quota - len(kept)
        tasks += kept
        report["projects"][p.name] = {
            "version": p.version, "tests_passing_clean": len(passing), "candidates": len(cands),
            "tried": tried, "kept": len(kept),
            "operators": dict(Counter(t.metadata["operator"] for t in kept))}
    bar.close()
    write_tasks(tasks, out_dir / "tasks.jsonl")
    report.update(num_tasks=len(tasks), build_s=round(time.monotonic() - started, 1),
                  tasks_path=str(out_dir / "tasks.jsonl"))
    if cfg.verify_tasks:
        sample = random.Random(cfg.seed).sample(tasks, min(cfg.verify_tasks, len(tasks)))
        slots = asyncio.Semaphore(cfg.workers)

        async def bounded(t: Task) -> bool:
            async with slots:
                return await verify_task(t, cfg, isolation)
        checks = await asyncio.gather(*(bounded(t) for t in sample))
        report["verified"] = {"tasks": len(sample), "ok": sum(checks),
                              "failed": [t.instance_id for t, ok in zip(sample, checks) if not ok]}
    (out_dir / "build_report.json").write_text(json.dumps(report, indent=2))
    return report


_WHOLE = number(whole=True, at_least=1)

# The builder's values (recipes/agents/build_tasks.yaml), checked before any work (a bad one: exit 2).
VALUE_RULES: dict[str, Rule] = {
    "out_dir": (is_text, "the folder to write tasks.jsonl and snapshots/ into"),
    "cache_dir": (is_text, "the folder for downloaded sdists and clean projects"),
    "work_dir": (or_null(is_text), "a folder for temporary workspaces, or null (the system temp)"),
    "seed": SEED_RULE,
    "num_tasks": (_WHOLE, "a whole number of tasks >= 1, e.g. num_tasks=240"),
    "workers": (_WHOLE, "a whole number of mutants tested at once >= 1, e.g. workers=2"),
    "min_failing": (_WHOLE, "a whole number >= 1 (a kept mutant fails at least one test)"),
    "max_failing": (_WHOLE, "a whole number >= min_failing"),
    "max_relevant_tests": (_WHOLE, "a whole number >= 1"),
    "extra_same_file_tests": (number(whole=True, at_least=0), "a whole number >= 0"),
    "max_pass_to_pass": (number(whole=True, at_least=0), "a whole number >= 0"),
    "max_per_function": (_WHOLE, "a whole number >= 1"),
    "hint_function": (lambda v: isinstance(v, bool), "true or false"),
    "mutant_timeout_s": (number(above=0), "seconds > 0"),
    "verify_tasks": (number(whole=True, at_least=0), "a whole number of tasks >= 0 (0: no check)"),
    "clean_run_timeout_s": (number(above=0), "seconds > 0"),
    "test_cmd": (is_text, "the command that runs pytest in a workspace"),
    "unsafe_no_isolation": (lambda v: isinstance(v, bool), "true or false"),
}


def _is_project(p) -> bool:
    return (isinstance(p, dict) and is_text(p.get("name")) and is_text(str(p.get("version", "")))
            and isinstance(p.get("source"), list) and len(p["source"]) > 0 and all(is_text(s) for s in p["source"])
            and is_text(p.get("tests")) and isinstance(p.get("keep", []), list))


PROJECTS_RULE: Rule = (lambda v: isinstance(v, list) and len(v) > 0 and all(_is_project(p) for p in v),
                       "a non-empty list of {name, version, source: [paths], tests: path, keep: [paths]}")


def check_build_cfg(cfg: DictConfig) -> None:
    """Check the builder's config before any download or test run.

    Raises:
        ConfigError: ``<key>=<value> is invalid: give <what>.`` for the first bad value, or
            a key the builder does not have (added with ``+``).
    """
    rules = {**VALUE_RULES, "projects": PROJECTS_RULE}
    added = sorted(str(k) for k in cfg if k not in rules)
    if added:  # `+name=value` adds a key the builder would ignore
        raise ConfigError(f"unknown config key '{added[0]}': the builder has no such option. Valid keys: "
                          f"{', '.join(sorted(rules))}.")
    check_values(cfg, rules)
    if cfg.max_failing < cfg.min_failing:
        raise ConfigError(f"max_failing={cfg.max_failing} is below min_failing={cfg.min_failing}: "
                          "give max_failing >= min_failing.")


def main() -> None:
    """Entry point of ``python -m agents.envs.build`` (``common.config.hydra_entry``): an
    unknown key or a bad value is one ``error:`` line, exit 2, before any work; ``--help``
    lists the config. A build that fails once started (a download, a project's clean tests,
    the sandbox) is one ``error:`` line, exit 1."""
    for error in (BuildError, SandboxError, TaskError):
        register_user_error(error, exit_code=EXIT_FAILURE)

    @hydra_entry("agents/build_tasks")
    def _main(cfg: DictConfig) -> None:
        from rollout.serve import stop_on_sigterm

        check_build_cfg(cfg)
        stop_on_sigterm()  # SIGTERM ends the build through the finally blocks (pip's temporary folder removed)
        report = asyncio.run(build(cfg))
        print(json.dumps(report, indent=2))
        print(f"built {report['num_tasks']} tasks in {report['build_s']} s -> {report['tasks_path']}")

    _main()


if __name__ == "__main__":
    main()
