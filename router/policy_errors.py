"""What a transport does when its policy raises: one treatment, used by both transports.

A ``Policy`` (:mod:`router.policies.base`) is pure code; an exception out of it is a bug
in the policy. The live router (:mod:`router.server`) and the simulator
(:mod:`router.sim.simulator`) treat it the same way, through :class:`PolicyErrors`:

- **Counted per call.** ``counts["decide"]`` / ``counts["observe"]``; the live router also
  exports them as ``router_policy_errors_total{call}`` on ``/metrics``, the simulator in
  its summary (``summary["policy_errors"]``).
- **observe():** logged with its traceback, and the event is dropped: the run goes on.
- **decide():** logged with its traceback, and that decision fails: the live router
  answers that HTTP request 500 (the rollout client retries a 5xx after
  :data:`POLICY_ERROR_RETRY_S`, ``rollout/client.py``), the simulator asks again after
  the same :data:`POLICY_ERROR_RETRY_S` (it models the client's retry as a
  ``Hold(POLICY_ERROR_RETRY_S)``). Either way the request is served once the policy
  answers.
- **raise_errors:** with ``raise_errors=True`` the exception is re-raised after it was
  counted, and the run stops. The simulator's default (``raise_policy_errors: true`` in
  ``recipes/sim.yaml``): in tests and policy development a policy bug must stop the run,
  not hide in a counter. The live router never sets it: a serving router keeps serving.
"""

from __future__ import annotations

import logging
from typing import Callable

from router.policies.base import Event, Hold, Policy

log = logging.getLogger(__name__)

POLICY_ERROR_RETRY_S = 0.5
"""Seconds before a request whose decide() raised is decided again: the rollout client's
first retry delay after a 5xx (``rollout.client.ModelClient``: 0.5 s, then doubling)."""

CALLS = ("decide", "observe")


class PolicyErrors:
    """Counts and logs a policy's exceptions (the module docstring's treatment).

    Args:
        policy_name: for the log lines.
        raise_errors: re-raise each exception after counting it.
        on_error: called with the call name (``decide`` / ``observe``) for each exception
            counted (the live router increments its Prometheus counter there).

    Attributes:
        counts: ``{"decide": n, "observe": n}``, exceptions seen per call.
    """

    def __init__(self, policy_name: str, *, raise_errors: bool = False,
                 on_error: Callable[[str], None] | None = None) -> None:
        self.policy_name = policy_name
        self.raise_errors = raise_errors
        self.on_error = on_error
        self.counts = dict.fromkeys(CALLS, 0)

    def _count(self, call: str) -> None:
        self.counts[call] += 1
        if self.on_error is not None:
            self.on_error(call)

    def observe(self, policy: Policy, event: Event) -> None:
        """``policy.observe(event)``; an exception is counted and logged, and the event dropped.

        Raises:
            Exception: the policy's own, when ``raise_errors``.
        """
        try:
            policy.observe(event)
        except Exception:
            self._count("observe")
            if self.raise_errors:
                raise
            log.exception("policy %s failed to observe %s", self.policy_name, type(event).__name__)

    def decide_failed(self, request_id: str, *, log_it: bool = True) -> Hold:
        """Count the decide() exception being handled; call it from the ``except`` block.

        Args:
            request_id: for the log line.
            log_it: log the traceback here (the live router's 500 path logs it itself).

        Returns:
            ``Hold(POLICY_ERROR_RETRY_S)``: when to decide again (the simulator's retry).

        Raises:
            Exception: the exception being handled, when ``raise_errors``.
        """
        self._count("decide")
        if self.raise_errors:
            raise  # noqa: PLE0704  (re-raises the exception the caller is handling)
        if log_it:
            log.exception("policy %s failed to decide %s; deciding again in %g s",
                          self.policy_name, request_id, POLICY_ERROR_RETRY_S)
        return Hold(POLICY_ERROR_RETRY_S, reason="policy error")
