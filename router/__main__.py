"""``python -m router``: run the live router (config ``recipes/router_service.yaml``).

Examples::

    python -m router engines.urls=[http://127.0.0.1:8001,http://127.0.0.1:8002]
    python -m router router=round-robin server.port=9000 engines.urls=[...]
    python -m router --cfg job          # the resolved config
    python -m router --help

A mistake in the command line (unknown key, unknown ``router=`` choice, bad policy
option) ends with one paragraph saying what was wrong and what is valid, exit code 2,
no traceback.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from router.policies.base import RouterConfigError

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"
CONFIG_NAME = "router_service"

log = logging.getLogger("router")

# Hydra flags that take a value in the next argument.
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--info", "-i", "--config-name", "-cn", "--config-dir", "-cd",
                     "--config-path", "-cp", "--experimental-rerun"}


def _user_overrides(argv: list[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _FLAGS_WITH_VALUE:
            skip = True
        elif not arg.startswith("-") and "=" in arg and not arg.lstrip("+~").startswith("hydra"):
            out.append(arg)
    return out


def _group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (RECIPES_DIR / group).glob("*.yaml"))


def explain_override_error(overrides: list[str], exc: Exception) -> str:
    """One paragraph for a Hydra composition error: what was wrong, what is valid."""
    from hydra import compose, initialize_config_dir

    text = str(exc).strip()
    for group in ("router",):
        if "Could not find" in text and f"'{group}/" in text:
            return (
                f"Unknown {group} choice in {' '.join(overrides)!r}: {text.splitlines()[0]} "
                f"Valid {group}=... choices: {', '.join(_group_options(group))}."
            )
    bad = next((o for o in overrides if f"'{o.split('=')[0].lstrip('+~')}'" in text), None)
    if bad is not None:
        key = bad.split("=")[0].lstrip("+~")
        if key.startswith("router.params."):
            return _explain_policy_param(overrides, key)
        with initialize_config_dir(config_dir=str(RECIPES_DIR), version_base=None):
            base = compose(CONFIG_NAME)
        parent_key = key.rpartition(".")[0]
        parent = OmegaConf.select(base, parent_key) if parent_key else base
        valid = ", ".join(str(k) for k in parent.keys()) if isinstance(parent, DictConfig) else "(not a section)"
        where = f"section {parent_key!r}" if parent_key else "the top level"
        return (
            f"Unknown config key {key!r} in override {bad!r}. Valid keys in {where}: {valid}. "
            "Run `python -m router --cfg job` to see the whole config."
        )
    return f"Invalid command line override(s) {' '.join(overrides)!r}: {' '.join(text.split())}"


def _explain_policy_param(overrides: list[str], key: str) -> str:
    from router.policies import policy_config_fields

    choice = next((o.split("=", 1)[1] for o in overrides if o.startswith("router=")), None)
    policy = OmegaConf.load(RECIPES_DIR / "router" / f"{choice or 'misa-t'}.yaml").policy
    try:
        valid = ", ".join(policy_config_fields(policy))
    except RouterConfigError as exc:
        valid = f"(unavailable: {exc})"
    return (
        f"Policy option {key!r} is not in the recipe: policy options are added with a leading '+', "
        f"e.g. +{key}=VALUE. Valid options of policy {policy!r}: {valid}."
    )


def check_overrides(argv: list[str]) -> None:
    """Compose the config with the command line's overrides once, before Hydra runs.

    Raises:
        RouterConfigError: an override names an unknown key or group choice, or does
            not parse; the message lists what is valid.
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = _user_overrides(argv)
    if not overrides:
        return
    try:
        with initialize_config_dir(config_dir=str(RECIPES_DIR), version_base=None):
            compose(CONFIG_NAME, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise RouterConfigError(explain_override_error(overrides, exc)) from None


async def serve(cfg: DictConfig) -> None:
    """Run the router until SIGINT/SIGTERM.

    Raises:
        RouterConfigError: a bad option (see ``router.server.build_service``).
    """
    from router.server import build_service

    port = cfg.server.port
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
        raise RouterConfigError(f"server.port must be a TCP port number (0 = any free one), got {port!r}")
    service = build_service(cfg)
    try:
        url = await service.start(cfg.server.host, port)
    except OSError as exc:
        raise RouterConfigError(f"cannot serve on {cfg.server.host}:{port} ({exc}); choose another server.port") from None
    log.info("router (policy %s) serving on %s for %s", service.policy.name, url, ", ".join(service.instances))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("router stopping")
    await service.stop()


@hydra.main(config_path=str(RECIPES_DIR), config_name=CONFIG_NAME, version_base=None)
def main(cfg: DictConfig) -> None:
    """Hydra entry point: run the router; a config mistake exits 2 with its message."""
    logging.getLogger().setLevel(str(cfg.server.log_level).upper())
    try:
        import uvloop  # libuv event loop: lower per-request latency than asyncio's default loop

        run = uvloop.run
    except ImportError:
        log.info("uvloop not installed: using the default asyncio event loop")
        run = asyncio.run
    try:
        run(serve(cfg))
    except RouterConfigError as exc:
        print(f"router: configuration error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    try:
        check_overrides(sys.argv[1:])
    except RouterConfigError as exc:
        print(f"router: configuration error: {exc}", file=sys.stderr)
        sys.exit(2)
    main()
