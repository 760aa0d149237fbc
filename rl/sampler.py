"""Multi-domain sampler: releases rollout units at the trainer's target mixture rho.

Each release is one GRPO *group*: a prompt drawn from a domain of the chosen workload
class, fanned out into G units (the class's ``group_size``) that share ``group_id``.
The class of the next group is chosen by deficit (largest remainder): the class whose
released units fall furthest below rho_b * A, where A counts all released units. This
keeps |A_b - rho_b * A| below one group for every class at every step, so the released
mixture tracks rho far tighter than independent random draws (whose error grows like
sqrt(A)). The domain within a class is chosen the same way from the class's domain
weights. Prompts within a domain come from a seeded numpy generator, so a run is
deterministic from ``seed`` and resumable through ``state_dict``/``load_state_dict``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from common.config import value_text
from rl.data.base import Prompt, PromptSource
from rl.mixture import MixtureError, normalize_mixture, weight_number


@dataclass(frozen=True)
class RolloutUnit:
    """One trainer-counted sample (DESIGN.md step 1); the router sees its labels.

    Attributes:
        unit_id: unique id of the unit (``X-Rollout-Unit``).
        session_id: the unit's session (``X-Session-Id``); one unit is one session, a
            single-turn sample or one agent trajectory.
        group_id: GRPO group id shared by the G siblings (``X-Group-Id``).
        workload_class: ``agent``, ``rlvr``, ``rlhf``, ... (``X-Workload-Class``).
        domain: the domain the prompt came from (``gsm8k``, ``arithmetic``, ...).
        policy_version: trainer policy version when the unit was released (staleness).
        prompt: the task.
        group_index: position 0..G-1 in its group.
        group_size: G.
    """

    unit_id: str
    session_id: str
    group_id: str
    workload_class: str
    domain: str
    policy_version: int
    prompt: Prompt
    group_index: int = 0
    group_size: int = 1

    def headers(self) -> dict[str, str]:
        """The request metadata headers of DESIGN.md for this unit's model calls
        (``X-Session-End`` is the worker's to add on the last call)."""
        return self.session().headers(session_end=False)

    def session(self):
        """The unit's identity for model calls (``rollout.client.SessionHeaders``)."""
        from router.headers import SessionHeaders

        return SessionHeaders(self.session_id, self.workload_class, self.group_id, self.unit_id)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {"unit_id": self.unit_id, "session_id": self.session_id,
                "group_id": self.group_id, "workload_class": self.workload_class,
                "domain": self.domain, "policy_version": self.policy_version,
                "prompt": self.prompt.to_dict(), "group_index": self.group_index,
                "group_size": self.group_size}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RolloutUnit":
        """Inverse of ``to_dict``."""
        return cls(**{**d, "prompt": Prompt.from_dict(d["prompt"])})


@dataclass
class WorkloadClassSpec:
    """The domains of one workload class and its GRPO group size.

    Attributes:
        sources: domain name -> (prompt source, weight). Weights are relative.
        group_size: G, units per prompt for this class (>= 1).
    """

    sources: dict[str, tuple[PromptSource, float]]
    group_size: int = 8
    domain_mix: dict[str, float] = field(init=False)

    def __post_init__(self) -> None:
        if int(self.group_size) < 1:
            raise MixtureError(f"group_size must be >= 1, got {self.group_size}")
        self.domain_mix = normalize_mixture({d: w for d, (_, w) in self.sources.items()})


def largest_deficit(target: Mapping[str, float], counts: Mapping[str, int]) -> str:
    """The key whose count lies furthest below its target share of the total.

    deficit_k = target_k * sum(counts) - counts_k; ties go to the larger target, then to
    the earlier key in ``target``'s order (deterministic). Keys with target 0 are never
    chosen.
    """
    total = sum(counts.get(k, 0) for k in target)
    best, best_key = None, None
    for k, share in target.items():
        if share <= 0.0:
            continue
        key = (share * total - counts.get(k, 0), share)
        if best is None or key > best:
            best, best_key = key, k
    assert best_key is not None, "normalize_mixture guarantees one positive share"
    return best_key


def check_sources(rho: Mapping[str, float], classes: Iterable[str]) -> None:
    """Every class with a positive share in ``rho`` is one of ``classes`` (those with
    prompt sources).

    Raises:
        MixtureError: the classes without sources, and what to do.
    """
    have = set(classes)
    missing = [b for b, w in normalize_mixture(rho).items() if w > 0 and b not in have]
    if missing:
        raise MixtureError(
            f"workload classes {missing} have a positive target share but no prompt "
            f"sources (classes with sources: {', '.join(sorted(have))}; a domain of weight 0 "
            "is off); give them sources or set their rho weight to 0")


class MixtureSampler:
    """Releases GRPO groups of rollout units whose classes follow rho.

    Args:
        rho: target mixture over workload classes (weights or percent; normalised).
        classes: workload class -> ``WorkloadClassSpec``; every class with rho_b > 0 needs
            one. A class with rho_b = 0 is never released.
        seed: random seed (prompt draws).
        run_id: prefix of group/unit ids (unique across runs sharing a router).

    Raises:
        MixtureError: invalid rho, or a class with positive weight and no spec.
    """

    def __init__(self, rho: Mapping[str, float], classes: Mapping[str, WorkloadClassSpec],
                 *, seed: int = 0, run_id: str = "run"):
        self.rho = normalize_mixture(rho)
        check_sources(self.rho, classes)
        self.classes = dict(classes)
        self.seed = int(seed)
        self.run_id = run_id
        self._rng = np.random.default_rng(self.seed)
        self.released_units: dict[str, int] = dict.fromkeys(self.rho, 0)
        self.released_groups_by_domain: dict[str, dict[str, int]] = {
            b: dict.fromkeys(spec.domain_mix, 0) for b, spec in self.classes.items()}
        self.num_groups = 0

    def next_group(self, policy_version: int) -> list[RolloutUnit]:
        """Release the next group: choose the class (largest deficit), then the domain
        (largest deficit within the class), draw one prompt and fan it out into G units
        stamped with ``policy_version``."""
        b = largest_deficit(self.rho, self.released_units)
        spec = self.classes[b]
        domain = largest_deficit(spec.domain_mix, self.released_groups_by_domain[b])
        prompt = spec.sources[domain][0].draw(self._rng)
        group_id = f"{self.run_id}-g{self.num_groups}"
        g = int(spec.group_size)
        units = [RolloutUnit(unit_id=f"{group_id}-u{i}", session_id=f"{group_id}-u{i}",
                             group_id=group_id, workload_class=b, domain=domain,
                             policy_version=int(policy_version), prompt=prompt,
                             group_index=i, group_size=g) for i in range(g)]
        self.num_groups += 1
        self.released_units[b] += g
        self.released_groups_by_domain[b][domain] += 1
        return units

    def release(self, max_units: int, policy_version: int) -> list[RolloutUnit]:
        """Whole groups, in order, while they fit in ``max_units`` units (the trainer's
        free in-flight slots). Returns [] when the next group does not fit; groups are
        never split, so a class whose G exceeds ``max_units`` waits for more slots."""
        out: list[RolloutUnit] = []
        while True:
            b = largest_deficit(self.rho, self.released_units)
            if len(out) + int(self.classes[b].group_size) > max_units:
                return out
            out.extend(self.next_group(policy_version))

    def released_mixture(self) -> dict[str, float]:
        """Class shares of the units released so far."""
        total = sum(self.released_units.values())
        return {b: (n / total if total else 0.0) for b, n in self.released_units.items()}

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: the generator's state and the release counters."""
        return {"seed": self.seed, "run_id": self.run_id, "rng": self._rng.bit_generator.state,
                "released_units": dict(self.released_units),
                "released_groups_by_domain": {b: dict(d) for b, d in
                                              self.released_groups_by_domain.items()},
                "num_groups": self.num_groups}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict`` output; the next group equals the one the saved
        sampler would have released.

        Raises:
            MixtureError: the saved state names classes or domains this sampler lacks.
        """
        unknown = set(state["released_groups_by_domain"]) - set(self.released_groups_by_domain)
        for b, d in state["released_groups_by_domain"].items():
            if b in self.released_groups_by_domain:
                unknown |= {f"{b}/{x}" for x in set(d) - set(self.released_groups_by_domain[b])}
        if unknown:
            raise MixtureError(f"sampler state names classes/domains {sorted(unknown)} that "
                               "this run's sampler does not have; resume with the same recipe")
        self.seed = int(state["seed"])
        self.run_id = str(state["run_id"])
        self._rng = np.random.default_rng()
        self._rng.bit_generator.state = state["rng"]
        self.released_units = {**dict.fromkeys(self.rho, 0), **state["released_units"]}
        for b, d in state["released_groups_by_domain"].items():
            self.released_groups_by_domain[b].update(d)
        self.num_groups = int(state["num_groups"])


def active_domains(domains: Mapping[str, Any] | None) -> dict[str, dict[str, tuple[dict, float]]]:
    """The prompt domains of ``trainer.domains`` that are switched on, with their weights.

    A domain's ``weight`` (default 1) is relative to the other domains of its class; 0
    switches it off: it is left out here, so its source is never built and its data (a
    GSM8K file, say) need not exist. A class whose domains are all off has no entry.

    Args:
        domains: class -> domain name -> options (``trainer.domains``).

    Returns:
        class -> domain name -> (options, weight > 0), in the recipe's order.

    Raises:
        MixtureError: a weight that is not a finite number >= 0 (the message names
            ``trainer.domains.<class>.<domain>.weight``).
    """
    out: dict[str, dict[str, tuple[dict, float]]] = {}
    for b, doms in (domains or {}).items():
        for name, opts in (doms or {}).items():
            opts = dict(opts or {})
            raw = opts.get("weight", 1.0)
            weight = weight_number(raw)
            if weight is None or not 0.0 <= weight < float("inf"):
                raise MixtureError(f"trainer.domains.{b}.{name}.weight={value_text(raw)}: give a number >= 0 "
                                   "(relative to the class's other domains; 0 switches the domain off)")
            if weight > 0.0:
                out.setdefault(str(b), {})[str(name)] = (opts, weight)
    return out


def sampler_from_config(tcfg: Mapping[str, Any], seed: int, run_id: str = "run",
                        extra_sources: Mapping[str, Mapping[str, tuple[PromptSource, float]]] | None = None
                        ) -> MixtureSampler:
    """Build the sampler of recipe group ``trainer`` (``recipes/trainer/grpo.yaml``).

    Args:
        tcfg: the ``trainer`` config (``rho``, ``group_size``, ``domains``).
        seed: the run's seed.
        run_id: prefix of group/unit ids.
        extra_sources: class -> domain -> (source, weight) built elsewhere, e.g. the
            agent server's task sets for class ``agent``; merged with ``domains``.

    Raises:
        MixtureError / DataError: a class with weight and no domain, a bad domain option.
    """
    from rl.data import make_source

    sources: dict[str, dict[str, tuple[PromptSource, float]]] = {}
    for b, doms in active_domains(tcfg.get("domains")).items():
        for name, (opts, weight) in doms.items():
            sources.setdefault(b, {})[name] = (make_source(name, opts), weight)
    for b, doms in (extra_sources or {}).items():
        sources.setdefault(b, {}).update(doms)
    sizes = dict(tcfg.get("group_size") or {})
    missing = [b for b in sources if b not in sizes]
    if missing:
        raise MixtureError(f"trainer.group_size has no entry for classes {missing}")
    classes = {b: WorkloadClassSpec(doms, group_size=int(sizes[b])) for b, doms in sources.items()}
    return MixtureSampler(dict(tcfg["rho"]), classes, seed=seed, run_id=run_id)
