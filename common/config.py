"""One config system for every entry point: Hydra config groups under ``recipes/``.

Every entry point (``python -m rl.train``, ``python -m rollout.serve``, ...) is wrapped
by ``hydra_entry``: before Hydra runs, the command line is composed once here so that a
mistake (an unknown key, an unknown group option, a malformed override) becomes one
clear message that lists the valid choices instead of a traceback. Errors of the
project's own parts raised later (engines, model, router, sandbox) are caught at the same
place and printed as their message alone. Every entry point exits with the same codes:

- 2 (``EXIT_USAGE``): the user's mistake in the command or its config, refused before
  anything starts (an unknown key, option or name, a bad value, a missing file);
- 1 (``EXIT_FAILURE``): a failure at run time (a process that did not come up, a run that
  failed; ``RunFailedError`` and the types registered with ``exit_code=EXIT_FAILURE``);
- 130 for Ctrl-C, 143 for SIGTERM.

Hydra's own flags keep working: ``--cfg job`` (add ``--resolve`` to resolve
interpolations), ``--help``, ``--info``, ``-m``.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import functools
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf

REPO_ROOT = Path(__file__).resolve().parent.parent
RECIPES_DIR = REPO_ROOT / "recipes"

# ${repo:relative/path} in a recipe: a path relative to the repository root, whatever the
# working directory (e.g. ${repo:../shared/data/gsm8k/train.jsonl}).
if not OmegaConf.has_resolver("repo"):
    OmegaConf.register_new_resolver("repo", lambda p: str((REPO_ROOT / str(p)).resolve()))


EXIT_USAGE = 2
"""Exit code of a command refused for the user's mistake in it or in its config."""
EXIT_FAILURE = 1
"""Exit code of a command that failed at run time."""


class ConfigError(ValueError):
    """The command line or a recipe is invalid; the message lists the valid choices."""


class RunFailedError(RuntimeError):
    """A command that had started failed (a child run, a process); exit code 1."""


# Errors printed at the entry point without a traceback, with their exit code. Each part
# registers its exception types with ``register_user_error``.
_USER_ERRORS: dict[type[BaseException], int] = {ConfigError: EXIT_USAGE, RunFailedError: EXIT_FAILURE}


def register_user_error(exc_type: type[BaseException], exit_code: int = EXIT_USAGE) -> type[BaseException]:
    """Mark ``exc_type`` as an error entry points print as its message alone, exiting with
    ``exit_code``: ``EXIT_USAGE`` (2, the default) for a mistake in the command or its
    config, ``EXIT_FAILURE`` (1) for a failure at run time.

    A subclass registered with its own code takes precedence over its base class.
    """
    _USER_ERRORS[exc_type] = exit_code
    return exc_type


# Sections whose keys are defined in code rather than in the recipe, with the function
# (imported only when needed) that says what is valid there given the composed config.
_SECTION_HELP = {"router.params": "router.policies.registry:router_params_help"}


def _section_help(section: str, cfg: DictConfig) -> str:
    import importlib

    module, _, name = _SECTION_HELP[section].partition(":")
    return getattr(importlib.import_module(module), name)(cfg)


def user_error_exit_code(exc: BaseException) -> int:
    """The exit code registered for the most specific registered class of ``exc``."""
    return next(_USER_ERRORS[cls] for cls in type(exc).__mro__ if cls in _USER_ERRORS)


# Hydra's own command-line flags (``--hydra-help`` lists them); every other word that starts
# with a dash is a mistake: settings are key=value overrides.
# Those that take a value (``--info``'s is optional) are skipped with it by _hydra_flags_removed.
_HYDRA_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                           "--config-dir", "-cd", "--info", "-i", "--experimental-rerun"}
_HYDRA_FLAGS = _HYDRA_FLAGS_WITH_VALUE | {"--help", "-h", "--hydra-help", "--version", "--resolve", "--run", "-r",
                                         "--multirun", "-m", "--shell-completion", "-sc"}


def refuse_unknown_flags(argv: Sequence[str], config_name: str | None = None) -> None:
    """Refuse a command-line word that starts with a dash and is not one of Hydra's flags.

    Args:
        argv: the command line after the program name.
        config_name: the recipe the command composes; when given, the refusal names the
            recipe's own keys with that name (``--port`` for the training recipe:
            ``trainer.rewards.server.port``), composed from the rest of the command line.

    Raises:
        ConfigError: naming the word and the key=value form (``--port 9000`` would otherwise
            reach Hydra's parser as the override ``9000``, "missing EQUAL").
    """
    for i, a in enumerate(argv):
        if a.startswith("-") and a.split("=", 1)[0] not in _HYDRA_FLAGS and not _is_number(a):
            name, _, value = a.lstrip("-").partition("=")
            name = name or "key"
            if not value and i + 1 < len(argv) and "=" not in argv[i + 1] and not argv[i + 1].startswith("-"):
                value = argv[i + 1]
            paths = _key_paths_named(config_name, name.replace("-", "_"), argv) if config_name else None
            if paths:
                form = (f"{paths[0]}={value or 'VALUE'}" if len(paths) == 1 else
                        f"one of {', '.join(f'{p}=VALUE' for p in paths)}")
                hint = f"here: {form}"
            elif paths == []:  # the config composed and has no such key: no key=value to guess
                hint = f"and no key of this command is named {name.replace('-', '_')}"
            else:
                hint = f"e.g. {name}=VALUE; a key in a section needs its path, as section.{name}=VALUE"
            raise ConfigError(f"{a}: not an option of this command. Settings are key=value without dashes "
                              f"({hint}); --help lists the keys and config groups")


def _key_paths_named(config_name: str, name: str, argv: Sequence[str]) -> list[str] | None:
    """The dotted paths of the keys called ``name`` (or ending in a dotted ``name``) in the
    config composed from ``argv``'s overrides (its dashed words and their values left out),
    shortest first ([] when it has none); None when that config cannot be composed or read
    (another mistake on the line, reported once this one is fixed)."""
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]  # a flag's value has no '='
    try:
        cfg = compose(config_name, overrides)
    except Exception:  # noqa: BLE001 -- a hint only: the refusal stands without it
        return None
    found: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, DictConfig):
            for k in node.keys():
                path = f"{prefix}{k}"
                if path == name or path.endswith("." + name):
                    found.append(path)
                walk(node._get_node(k), path + ".")  # the node, unresolved: no interpolation resolved here

    try:
        walk(cfg, "")
    except Exception:  # noqa: BLE001 -- a config the walk cannot read: no hint
        return None
    return sorted(found, key=lambda p: (p.count("."), p))


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _hydra_flags_removed(argv: Sequence[str]) -> list[str]:
    """The overrides of a command line, without Hydra's own flags."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in _HYDRA_FLAGS_WITH_VALUE:
            skip = a not in ("--info", "-i")
            continue
        if a.startswith("-"):
            continue
        if a.startswith("hydra.") or a.startswith("hydra/") or a.startswith("+hydra"):
            continue
        out.append(a)
    return out


def group_options(group: str) -> list[str]:
    """The options of config group ``group`` (the yaml files in recipes/<group>/)."""
    d = RECIPES_DIR / group
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def _keys_at(cfg: DictConfig, dotted: str) -> tuple[str, list[str]]:
    """The deepest existing parent of ``dotted`` in ``cfg`` and the keys under it."""
    parts = dotted.split(".")
    node, path = cfg, []
    for p in parts[:-1]:
        if isinstance(node, DictConfig) and p in node and isinstance(node[p], DictConfig):
            node = node[p]
            path.append(p)
        else:
            break
    return ".".join(path), sorted(str(k) for k in node.keys()) if isinstance(node, DictConfig) else []


# A key a part renamed -> its new name (``register_renamed_key``); a command or recipe that
# still gives the old key is refused with one line naming the new one, never ignored.
_RENAMED_KEYS: dict[str, str] = {}


def register_renamed_key(old_key: str, new_key: str) -> None:
    """Refuse the dotted config key ``old_key`` (``sessions.idle_timeout_s``) wherever it is
    given, as an override (``key=``, ``+key=``) or in a composed recipe, with a ``ConfigError``
    that names ``new_key``."""
    _RENAMED_KEYS[old_key] = new_key


def _renamed_key_message(key: str) -> str:
    new = _RENAMED_KEYS[key]
    return f"config key '{key}' was renamed '{new}': give {new}=... instead"


def _has_key(cfg: DictConfig, dotted: str) -> bool:
    """``dotted`` is a key of ``cfg``; its value is not resolved (a default that needs
    Hydra's run, like ``run_dir``'s ``${hydra:...}``, still counts as there)."""
    parent, _, last = dotted.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None, throw_on_resolution_failure=False) if parent else cfg
    return isinstance(node, DictConfig) and last in node


def refuse_renamed_keys(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` when ``cfg`` still holds a key ``register_renamed_key`` retired."""
    for old in _RENAMED_KEYS:
        if _has_key(cfg, old):
            raise ConfigError(_renamed_key_message(old))


def compose(config_name: str, overrides: Sequence[str] = (), return_hydra_config: bool = False) -> DictConfig:
    """Compose ``recipes/<config_name>.yaml`` with command-line ``overrides``.

    Returns the composed config (interpolations not yet resolved), in struct mode; with
    ``return_hydra_config``, Hydra's own settings too (under ``hydra``).

    Raises:
        ConfigError: an override names an unknown key or group option, or is malformed;
            the message names it and lists the valid keys or options (a renamed key: its
            new name).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException

    overrides = list(overrides)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(RECIPES_DIR), version_base=None):
            try:
                cfg = hydra_compose(config_name=config_name, overrides=overrides,
                                    return_hydra_config=return_hydra_config)
                refuse_renamed_keys(cfg)
                return cfg
            except MissingConfigException as e:
                raise ConfigError(_missing_option_message(e, overrides)) from None
            except OverrideParseException as e:
                raise ConfigError(f"malformed override: {e}. Overrides look like key=value, "
                                  "group=option, or +new.key=value.") from None
            except ConfigCompositionException as e:
                base = [o for o in overrides if "=" in o and _is_group(o.split("=")[0].lstrip("+~"))]
                raise ConfigError(_unknown_key_message(e, config_name, overrides, base)) from None
    finally:
        GlobalHydra.instance().clear()


def _is_group(key: str) -> bool:
    return (RECIPES_DIR / key).is_dir()


def config_groups(config_name: str) -> list[str]:
    """The config groups ``recipes/<config_name>.yaml`` chooses in its defaults list (in order;
    Hydra's own ``hydra/...`` groups left out)."""
    defaults = OmegaConf.load(RECIPES_DIR / f"{config_name}.yaml").get("defaults") or []
    groups = []
    for entry in defaults:
        if isinstance(entry, (dict, DictConfig)):
            for key in entry:
                group = str(key).removeprefix("override ").strip().lstrip("/").split("@")[0]
                if not group.startswith("hydra/") and group not in groups:
                    groups.append(group)
    return groups


def nearest_options(value: str, options: Sequence[str]) -> list[str]:
    """The options a misspelt ``value`` most likely meant (none, one or two), for a "did you
    mean": the option itself written in another case or with ``_`` for ``-`` (``MISA-T``,
    ``misa_t``: ``misa-t``); else the nearest, after a near one that ``value`` starts with
    (``mixed_step_cpu``: ``mixed_step``, then ``mixed_step_gpu``, never the GPU recipe alone)."""
    def same(text: str) -> str:
        return text.lower().replace("_", "-")

    spelt = [o for o in options if same(o) == same(value)]
    if spelt:
        return spelt[:1]
    low = value.lower()
    near = difflib.get_close_matches(low, options, n=2)
    return list(dict.fromkeys([c for c in near if low.startswith(c)] + near[:1]))


def _missing_option_message(e: Exception, overrides: Sequence[str]) -> str:
    for o in overrides:
        key, _, value = o.lstrip("+~").partition("=")
        if _is_group(key) and value not in group_options(key):
            options = group_options(key)
            close = nearest_options(value, options)
            guess = f" Did you mean {' or '.join(f'{key}={c}' for c in close)}?" if close else ""
            return f"{key}={value}: no such {key}.{guess} Valid options for {key}: {', '.join(options)}."
    return f"{e}"


def _unknown_key_message(e: Exception, config_name: str, overrides: Sequence[str],
                         group_overrides: Sequence[str]) -> str:
    from hydra import compose as hydra_compose

    try:
        cfg = hydra_compose(config_name=config_name, overrides=list(group_overrides))
    except Exception:  # the group overrides alone fail: a group this config does not use, or Hydra's text
        groups = config_groups(config_name)
        for o in group_overrides:
            key = o.split("=", 1)[0].lstrip("~")
            if not o.startswith("+") and key not in groups:
                return (f"{o}: this command has no '{key}' choice (recipes/{config_name}.yaml chooses "
                        f"{', '.join(groups) or 'no groups'}).")
        return str(e)
    for o in overrides:
        if o.startswith("+") or "=" not in o:
            continue
        key = o.split("=", 1)[0].lstrip("~")
        if _is_group(key):
            continue
        if key in _RENAMED_KEYS:
            return _renamed_key_message(key)
        if not _has_key(cfg, key):
            section = next((sec for sec in _SECTION_HELP if key.startswith(sec + ".")), None)
            if section is not None:
                return (f"unknown config key '{key}': options under '{section}' are added with a leading '+', "
                        f"e.g. +{key}=VALUE. {_section_help(section, cfg)}")
            parent, keys = _keys_at(cfg, key)
            where = f"under '{parent}'" if parent else "at the top level"
            if not keys:  # an empty section, e.g. a policy run with its defaults: {}
                return (f"unknown config key '{key}': '{parent}' is empty here, so its options are added with "
                        f"a leading '+', e.g. +{key}=VALUE")
            depth = len(parent.split(".")) if parent else 0
            wrong, rest = key.split(".")[depth], key.split(".")[depth + 1:]  # the first part not found
            close = [k for k in difflib.get_close_matches(wrong, keys, n=1) if k != wrong]
            path = ".".join([*filter(None, [parent]), *close[:1], *rest])
            if close and _has_key(cfg, path):  # only a key that is there
                guess = f"Did you mean '{path}'? "
            elif close and rest:  # the section is misspelled, and what follows is not under it either
                guess = f"Did you mean '{'.'.join([*filter(None, [parent]), close[0]])}' (then a key under it)? "
            else:
                guess = ""
            return (f"unknown config key '{key}'. {guess}Valid keys {where}: {', '.join(keys)}. "
                    f"(To add a new key on purpose, write +{key}=...)")
    return str(e).splitlines()[0]


def usage_error(message: object) -> SystemExit:
    """Print ``error: <message>`` and return the SystemExit of a command refused for the
    user's mistake (exit 2), for the caller to raise."""
    print(f"error: {message}", file=sys.stderr)
    return SystemExit(EXIT_USAGE)


PLOT_SUFFIXES = (".png", ".pdf", ".svg")
"""The chart formats a benchmark's ``--plot`` takes (matplotlib writes each by its suffix)."""


def check_plot_path(path: Path, example_name: str) -> None:
    """Refuse a benchmark's ``--plot`` before any timing, and make its folder.

    Args:
        path: the chart's file, ending in one of :data:`PLOT_SUFFIXES`.
        example_name: a file name the message offers instead (``"router_proxy.png"``).

    Raises:
        SystemExit: exit 2 after one ``error:`` line when ``path`` is a folder, lacks a chart
            suffix, or its folder cannot be made.
    """
    hint = f"give the chart's file name ending in {', '.join(PLOT_SUFFIXES[:-1])} or {PLOT_SUFFIXES[-1]}"
    if path.is_dir():
        raise usage_error(f"--plot {path} is a folder; {hint}, e.g. {path / example_name}")
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise usage_error(f"--plot {path}: {hint}, e.g. {example_name}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise usage_error(f"--plot {path}: cannot make its folder ({exc.strerror})") from None


class CommandParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose refusals are one line, as every entry point's:
    ``error: <argparse's message> (python -m X --help lists the options)``, exit 2, no usage
    block (a command line it cannot parse: an unknown flag, a value of the wrong type, a
    missing argument). An option is matched by its whole name only: argparse's default
    takes any unambiguous prefix (``--policy misa_t`` would set ``--policy-param``, not
    ``--policies``), so a mistyped option would run with another's value."""

    def __init__(self, *args, allow_abbrev: bool = False, **kwargs) -> None:
        super().__init__(*args, allow_abbrev=allow_abbrev, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        switch = re.fullmatch(r"argument (\S+): ignored explicit argument (.*)", message)
        if switch:  # --flag=value for a flag that takes none: say what to give instead
            flags = switch.group(1).split("/")
            message = (f"{switch.group(1)} is a switch and takes no value (got {switch.group(2)}): "
                       f"give {' or '.join(flags)} alone")
        raise usage_error(f"{message} ({self.prog} --help lists the options)")


def compose_or_exit(config_name: str, argv: Sequence[str], return_hydra_config: bool = False) -> DictConfig:
    """``compose`` for command-line use (a dashed word not Hydra's refused first:
    ``refuse_unknown_flags``): on ConfigError print the message and exit 2."""
    try:
        refuse_unknown_flags(argv, config_name)
        return compose(config_name, _hydra_flags_removed(argv), return_hydra_config)
    except ConfigError as e:
        raise usage_error(e) from None


def _print_stopped(why: str) -> None:
    print(f"stopped ({why}); every process this command started has been stopped", file=sys.stderr)


def print_help(config_name: str, argv: Sequence[str]) -> None:
    """``--help`` of an entry point: what ``recipes/<config_name>.yaml`` says it is (its first
    comment line), the config groups it chooses with their options, and the config as
    composed with the other arguments (``router=round-robin --help`` shows that router's).
    Unlike Hydra's own help it lists only the groups this command uses. A bad override
    exits 2 with one ``error:`` line, as without ``--help``."""
    lines = (RECIPES_DIR / f"{config_name}.yaml").read_text().splitlines()
    first = [line for line in lines if not re.match(r"#\s*@", line)][:1]  # past a `# @package` header
    cfg = compose_or_exit(config_name, argv)
    out = [first[0].lstrip("#").strip() if first and first[0].startswith("#") else config_name, ""]
    groups = config_groups(config_name)
    if groups:
        out.append("Config groups (choose one with group=option):")
        out += [f"  {g}: {', '.join(group_options(g))}" for g in groups]
        out.append("")
    out.append("Config (override any key with key=value; a key that is not there needs +key=value):")
    out.append("")
    out.append(OmegaConf.to_yaml(cfg).rstrip())
    out.append("")
    for section in _SECTION_HELP:
        if OmegaConf.select(cfg, section, default=None) is not None:
            out.append(f"Options under '{section}' are added with a leading '+', e.g. +{section}.NAME=VALUE. "
                       f"{_section_help(section, cfg)}")
            out.append("")
    out.append("--cfg job [--resolve] prints the composed config; --hydra-help shows Hydra's own flags.")
    print("\n".join(out))


# --------------------------------------------------------------------------- values

Rule = tuple[Callable[[Any], bool], str]
"""``(ok(value), what to give instead)`` for one config key (see ``check_values``)."""


def number(above: float | None = None, at_least: float | None = None, at_most: float | None = None,
           below: float | None = None, whole: bool = False) -> Callable[[Any], bool]:
    """A test for a number (an integer with ``whole``; never a boolean) within the bounds given."""
    def ok(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, int if whole else (int, float)):
            return False
        return ((above is None or v > above) and (at_least is None or v >= at_least)
                and (at_most is None or v <= at_most) and (below is None or v < below))
    return ok


is_seed = number(at_least=0, whole=True)
"""A random seed: a whole number >= 0 (numpy's generators refuse a negative one)."""

SEED_RULE: Rule = (is_seed, "a whole number >= 0, e.g. seed=0")
"""The ``check_values`` rule of a ``seed`` key."""


def or_null(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """``test``, or the value is null."""
    return lambda v: v is None or test(v)


def is_text(v: Any) -> bool:
    """A non-empty string."""
    return isinstance(v, str) and v.strip() != ""


def value_text(value: Any) -> str:
    """``value`` as a user writes it on the command line (YAML): ``true``/``false``, ``null``,
    text in quotes, numbers and lists as Python prints them; for messages that echo a value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return repr(value)


def check_values(cfg: Any, rules: dict[str, Rule]) -> None:
    """Check the values of a composed config at dotted keys against ``rules``.

    Args:
        cfg: the config (a DictConfig, resolved on access, or a plain mapping).
        rules: ``{dotted key: (ok(value), what to give)}``; a key absent from ``cfg`` is
            skipped (its recipe may not have it).

    Raises:
        ConfigError: ``<key>=<value> is invalid: give <what>.`` for the first value that fails.
    """
    node = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(cfg)
    for key, (ok, want) in rules.items():
        value = OmegaConf.select(node, key, default="__missing__")
        if isinstance(value, str) and value == "__missing__":
            continue
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value, resolve=True)
        if not ok(value):
            raise ConfigError(f"{key}={value_text(value)} is invalid: give {want}.")


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
"""The shape of a hub id (model or dataset): ``name`` or ``owner/name``."""


def reads_as_local_path(text: str) -> bool:
    """``text`` names a local path, not a hub id: it starts with ``.``, ``/`` or ``~``, has
    another shape than a hub id (``runs/x/checkpoint``: two separators), or its first part
    is a folder here (``runs/checkpoint`` with ``runs/`` in the current folder). Relative
    paths are read from the current folder, as the model loaders read them."""
    if text.startswith((".", "/", "~")) or HUB_ID.fullmatch(text) is None:
        return True
    owner, sep, _ = text.partition("/")
    return bool(sep) and Path(owner).is_dir()


def missing_local_path(key: str, path: Any, instead: str = "") -> str | None:
    """The message for ``key=path`` when ``path`` reads as a local path
    (``reads_as_local_path``) that does not exist, else None (it exists, or is a hub id
    such as ``org/name``, which nothing here checks or downloads before the loader does).
    ``instead``: more to offer, e.g. `` or leave model.path unset``."""
    text = str(path)
    local = Path(text).expanduser()
    if not reads_as_local_path(text) or local.exists():
        return None
    where = "" if local.is_absolute() else f" (read from the current folder: {local.resolve()})"
    return (f"{key}={text} does not exist{where}. Give an existing local Hugging Face folder or a hub id "
            f"(org/name){instead}.")


@contextlib.contextmanager
def _hydra_config_set(cfg: DictConfig):
    """``cfg`` (composed with Hydra's config) as Hydra's own while inside, for
    ``${hydra:runtime.choices...}`` in a run folder's name."""
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().set_config(cfg)
    try:
        yield
    finally:
        HydraConfig.instance().cfg = None  # hydra.main sets its own


def _run_dir_of(cfg: DictConfig) -> Path | None:
    """The run folder (``hydra.run.dir`` of ``cfg``, composed with Hydra's config), or None
    where its name cannot be resolved before Hydra runs."""
    with _hydra_config_set(cfg):
        try:
            return Path(str(cfg.hydra.run.dir)).resolve()
        except Exception:  # a name only Hydra's run can resolve: then only the run folder is removed
            return None


def check_run_dir(cfg: DictConfig, run_dir: Path) -> None:
    """Refuse a run folder Hydra could not make or write in, before it tries (its
    ``FileExistsError`` or ``NotADirectoryError`` would be a traceback): ``run_dir`` is a
    file, lies under a file, or its folders cannot be made (``/proc/x``, a read-only
    place). The first folder to make is made and removed again to find out.

    Raises:
        ConfigError: naming the key the run folder comes from (``run_dir``, ``out_dir``).
    """
    raw = OmegaConf.to_container(cfg.hydra.run, resolve=False)["dir"]
    ref = re.match(r"\$\{([A-Za-z_][\w.]*)\}", str(raw))
    key = ref.group(1) if ref else "hydra.run.dir"
    with _hydra_config_set(cfg):
        given = f"{key}={OmegaConf.select(cfg, key, default=run_dir)}"
    fix = "give a folder to make or an existing run folder"
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"{given}: {run_dir} is a file, not a folder; {fix}")
    missing = [p for p in (run_dir, *run_dir.parents) if not p.exists()]
    if not missing:
        if not os.access(run_dir, os.W_OK | os.X_OK):
            raise ConfigError(f"{given}: cannot write in {run_dir} (permission denied); {fix}")
        return
    first = missing[-1]
    if not first.parent.is_dir():
        raise ConfigError(f"{given}: {first.parent} is a file, not a folder; {fix}")
    try:
        first.mkdir()
        first.rmdir()
    except OSError as e:
        raise ConfigError(f"{given}: cannot make {first} ({e.strerror}); {fix}") from None


def _remove_refused_run_dir(new_parents: Sequence[Path] = ()) -> None:
    """Remove the run folder Hydra made for a command that was refused, if it holds only
    Hydra's own files (``.hydra/`` and top-level ``*.log``), and then those of
    ``new_parents`` (folders above it that the command made, innermost first) left empty:
    a refused command leaves no empty folder behind. A run folder with anything else in
    it (the job got further) is kept."""
    import shutil

    from hydra.core.hydra_config import HydraConfig

    try:
        out = Path(HydraConfig.get().runtime.output_dir).resolve()
    except ValueError:  # Hydra is not running
        return
    if out in (Path.cwd().resolve(), REPO_ROOT) or not out.is_dir():
        return
    for entry in out.iterdir():
        if not (entry.name == ".hydra" and entry.is_dir() or entry.is_file() and entry.suffix == ".log"):
            return
    shutil.rmtree(out, ignore_errors=True)
    for parent in (p for p in new_parents if p in out.parents):
        try:
            parent.rmdir()  # only when empty
        except OSError:
            break


def hydra_entry(config_name: str) -> Callable[[Callable[[DictConfig], object]], Callable[[], None]]:
    """Decorator for an entry point ``fn(cfg)`` driven by ``recipes/<config_name>.yaml``.

    The command line is validated first (see module docstring); then ``hydra.main``
    runs ``fn``; user errors raised inside (types registered with
    ``register_user_error``) are printed as ``error: <message>`` with their exit code.
    Ctrl-C (exit 130) and SIGTERM (143, where the command calls ``stop_on_sigterm``) end
    with one ``stopped (...)`` line instead of a traceback.
    """

    def wrap(fn: Callable[[DictConfig], object]) -> Callable[[], None]:
        import hydra

        new_parents: list[Path] = []  # folders above the run folder that Hydra is about to make

        @hydra.main(config_path=str(RECIPES_DIR), config_name=config_name, version_base=None)
        def _run(cfg: DictConfig) -> None:
            try:
                fn(cfg)
            except tuple(_USER_ERRORS) as e:
                _remove_refused_run_dir(new_parents)
                print(f"error: {e}", file=sys.stderr)
                raise SystemExit(user_error_exit_code(e))

        @functools.wraps(fn)
        def main() -> None:
            argv = sys.argv[1:]
            if any(a in ("--help", "-h") for a in argv):
                print_help(config_name, argv)
                return
            if "--hydra-help" not in argv:
                cfg = compose_or_exit(config_name, argv, True)
                run_dir = _run_dir_of(cfg)
                if run_dir is not None:
                    new_parents[:] = [p for p in run_dir.parents if not p.exists()]
                    if not any(a.startswith("-") for a in argv):  # a run, not --cfg, --info or -m
                        try:
                            check_run_dir(cfg, run_dir)
                        except ConfigError as e:
                            raise usage_error(e) from None
            try:
                _run()
            except KeyboardInterrupt:  # Ctrl-C: the with/finally blocks on the way up stopped the children
                _print_stopped("Ctrl-C")
                raise SystemExit(130) from None
            except SystemExit as e:
                if e.code == 143:  # SIGTERM, turned into SystemExit(143) by rollout.serve.stop_on_sigterm
                    _print_stopped("SIGTERM")
                raise

        return main

    return wrap
