"""The router's signals from the engines: Prometheus scrapes and KV-cache events.

Two feeds per engine instance (DESIGN.md, "Signals"), both turned into the policy
core's events (``router/policies/base.py``):

- **Metrics**: ``GET {instance}/metrics`` every ``scrape_interval_s``, parsed with
  prometheus_client's text parser into :class:`InstanceMetrics` -> ``MetricsSampled``.
- **KV events**: vLLM's ZMQ publisher (3 frames: topic, 8-byte big-endian sequence
  number, msgpack ``[ts, events, dp_rank]``; events tagged ``type`` = ``BlockStored`` /
  ``BlockRemoved`` / ``AllBlocksCleared``, layout of
  ``vllm/distributed/kv_events.py``). vLLM's block hashes are its own (sha256 bytes or
  64-bit ints); :class:`KvHashTranslator` re-hashes each stored block's token ids with
  the project's chain (``router.prefix_index.chain_hashes``) so that stored blocks and
  request prompts meet in one hash space -> ``BlocksStored`` / ``BlocksRemoved`` /
  ``AllBlocksCleared``.

Late, missing or garbage signals never raise out of these loops: a failed scrape leaves
the last sample to age (the policy sees ``metrics_age_s`` grow), a lost KV event batch
(sequence gap) clears that instance's prefix index (a missing block is safe, a phantom
one misroutes), undecodable frames are dropped. Each kind of trouble is logged once per
instance.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Hashable, Iterable, Sequence

import aiohttp
import msgspec
import zmq
import zmq.asyncio
from prometheus_client.parser import text_string_to_metric_families

from router.policies.base import AllBlocksCleared, BlocksRemoved, BlocksStored, Event, InstanceMetrics
from router.prefix_index import chain_hashes

log = logging.getLogger(__name__)

EventSink = Callable[[Event], None]
"""Where signals go: the server's ``observe`` (updates its view, then the policy's)."""


class _LogOnce:
    """Log each (instance, kind) of signal trouble once, then stay quiet."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()

    def warn(self, instance: str, kind: str, msg: str) -> None:
        if (instance, kind) not in self._seen:
            self._seen.add((instance, kind))
            log.warning("%s: %s (further %s problems of this instance are not logged)", instance, msg, kind)

    def clear(self, instance: str, kind: str) -> None:
        self._seen.discard((instance, kind))


# --------------------------------------------------------------------------- metrics

# InstanceMetrics field -> vLLM sample names, newest first (older vLLM spelled some with gpu_).
_SUMMED = {
    "num_requests_running": ("vllm:num_requests_running",),
    "num_requests_waiting": ("vllm:num_requests_waiting",),
    "prefix_cache_queries_total": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits_total": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "prompt_tokens_total": ("vllm:prompt_tokens_total",),
    "generation_tokens_total": ("vllm:generation_tokens_total",),
    "num_preemptions_total": ("vllm:num_preemptions_total",),
    "engine_steps_total": ("vllm:iteration_tokens_total_count",),  # a histogram's count: one per step
    "prefills_total": ("vllm:time_to_first_token_seconds_count",),  # one per request's first token
    # engine-side request time: from the arrival vLLM stamps (its API server hands the request on) to the last token
    "e2e_latency_s_total": ("vllm:e2e_request_latency_seconds_sum",),
    "e2e_requests_total": ("vllm:e2e_request_latency_seconds_count",),
    "queue_time_s_total": ("vllm:request_queue_time_seconds_sum",),
    "prefill_time_s_total": ("vllm:request_prefill_time_seconds_sum",),
    "decode_time_s_total": ("vllm:request_decode_time_seconds_sum",),
}
_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_CACHE_INFO = "vllm:cache_config_info"


def parse_engine_metrics(text: str) -> InstanceMetrics:
    """Parse one vLLM ``/metrics`` page into :class:`InstanceMetrics`.

    Values with several label sets (one per engine core, data parallel) are summed;
    ``kv_cache_usage`` takes the maximum (the fullest core bounds admission). Block size
    and block count come from the labels of ``vllm:cache_config_info``.

    Raises:
        ValueError: the text is not Prometheus exposition format, or holds no
            ``vllm:num_requests_running`` (not a vLLM engine, or not ready).
    """
    values: dict[str, float] = {}
    kv_usage: float | None = None
    block_size = num_blocks = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name in _KV_USAGE:
                kv_usage = max(kv_usage or 0.0, float(sample.value))
            elif name == _CACHE_INFO:
                block_size = _int_label(sample.labels, "block_size")
                num_blocks = _int_label(sample.labels, "num_gpu_blocks")
            else:
                values[name] = values.get(name, 0.0) + float(sample.value)
    if "vllm:num_requests_running" not in values:
        raise ValueError("no vllm:num_requests_running sample: not a vLLM /metrics page")
    fields: dict = {}
    for field, names in _SUMMED.items():
        found = next((n for n in names if n in values), None)
        if found is not None:
            fields[field] = values[found]
    fields["num_requests_running"] = int(fields["num_requests_running"])
    fields["num_requests_waiting"] = int(fields.get("num_requests_waiting", 0))
    return InstanceMetrics(
        kv_cache_usage=kv_usage if kv_usage is not None else 0.0,
        num_blocks=num_blocks,
        block_size=block_size,
        **fields,
    )


def _int_label(labels: dict, key: str) -> int | None:
    try:
        return int(float(labels[key]))
    except (KeyError, ValueError, TypeError):
        return None


class MetricsScraper:
    """Scrape every instance's ``/metrics`` periodically (one task for all instances).

    Args:
        instances: engine base URLs (``http://host:port``).
        on_sample: ``on_sample(instance, metrics, now_s)`` after each good scrape.
        interval_s: time between scrape rounds (``signals.scrape_interval_s``).
        timeout_s: per-request timeout; a slow engine's sample is skipped, not awaited.
        clock: the router's clock (seconds).
        on_unreachable: ``on_unreachable(instance)`` when a scrape cannot connect at all
            (refused, unknown host): the router marks the engine unhealthy and probes it.
        on_failure: ``on_failure(instance)`` after each failed scrape (timeout, HTTP error,
            unparsable page), for the router's counters.
        idle: ``idle()`` True when nothing can change the engines' figures but a request the
            router has not sent yet (nothing in flight or held, every last sample showing no
            request running or waiting); then rounds come every ``idle_interval_s`` instead,
            until :meth:`wake`. Rendering and parsing the pages of two idle engines every
            0.5 s cost their API servers and the router 7-12% of a core on the 2-core
            machine, beside a learner that needs the cores. None: always ``interval_s``.
        idle_interval_s: time between rounds while ``idle()`` (>= ``interval_s``; keep it
            under the policies' ``metrics_stale_s``, 10 s by default).
    """

    def __init__(
        self,
        instances: Sequence[str],
        on_sample: Callable[[str, InstanceMetrics, float], None],
        *,
        interval_s: float = 0.5,
        timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        on_unreachable: Callable[[str], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
        idle: Callable[[], bool] | None = None,
        idle_interval_s: float = 5.0,
    ) -> None:
        self.instances = list(instances)
        self.idle = idle
        self.idle_interval_s = max(idle_interval_s, interval_s)
        self._wake = asyncio.Event()  # set by wake(); bound to no loop until awaited
        self.on_sample = on_sample
        self.on_unreachable = on_unreachable
        self.on_failure = on_failure
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        self._log = _LogOnce()
        self._session: aiohttp.ClientSession | None = None

    async def scrape_once(self) -> None:
        """One round: scrape all instances concurrently; failures are logged once each."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        await asyncio.gather(*(self._scrape(i) for i in self.instances))

    async def _scrape(self, instance: str) -> None:
        assert self._session is not None
        try:
            async with self._session.get(f"{instance}/metrics") as resp:
                if resp.status != 200:
                    raise ValueError(f"/metrics answered HTTP {resp.status}")
                text = await resp.text()
            metrics = parse_engine_metrics(text)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, UnicodeDecodeError) as exc:
            self._log.warn(instance, "scrape", f"metric scrape failed ({type(exc).__name__}: {exc}); routing uses "
                           "its last sample, if any, more cautiously as it ages")
            if self.on_failure is not None:
                self.on_failure(instance)
            if isinstance(exc, aiohttp.ClientConnectorError) and self.on_unreachable is not None:
                self.on_unreachable(instance)  # nothing listens there: no request should wait to find out
            return
        self._log.clear(instance, "scrape")
        self.on_sample(instance, metrics, self.clock())

    async def run(self, scraped_just_now: bool = False) -> None:
        """Scrape forever every ``interval_s`` (cancel the task to stop); with
        ``scraped_just_now`` (the caller has just scraped once) the first scrape comes one
        interval later, not at once."""
        try:
            if scraped_just_now:
                await asyncio.sleep(self.interval_s)
            while True:
                started = self.clock()
                await self.scrape_once()
                await self._pause(self.interval_s - (self.clock() - started))
        finally:
            await self.close()

    def wake(self) -> None:
        """A request is going out: end an idle wait at once (the next round scrapes now)."""
        self._wake.set()

    async def _pause(self, busy_s: float) -> None:
        """Wait ``busy_s``, or up to ``idle_interval_s`` while ``idle()`` and nobody wakes us."""
        self._wake.clear()
        if self.idle is None or not self.idle():  # read after the clear: a wake before it shows here
            await asyncio.sleep(max(0.0, busy_s))
            return
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=self.idle_interval_s)
        except asyncio.TimeoutError:
            pass

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


# --------------------------------------------------------------------------- KV events


class _BlockStored(msgspec.Struct, tag="BlockStored", gc=False):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int


class _BlockRemoved(msgspec.Struct, tag="BlockRemoved", gc=False):
    block_hashes: list[int | bytes]


class _AllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", gc=False):
    pass


class _EventBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_BlockStored | _BlockRemoved | _AllBlocksCleared]
    data_parallel_rank: int | None = None


_batch_decoder = msgspec.msgpack.Decoder(_EventBatch)


def decode_kv_events(payload: bytes) -> list:
    """The events of one vLLM KV-event message (its third ZMQ frame), in order.

    Raises:
        msgspec.DecodeError / msgspec.ValidationError: not a vLLM KV event batch.
    """
    return _batch_decoder.decode(payload).events


class KvHashTranslator:
    """Per instance, vLLM block hash -> the project's block hash; emits policy events.

    vLLM hashes a block from its parent's hash and its token ids with its own function;
    we recompute ours with ``chain_hashes(token_ids, block_size, parent=ours(parent))``
    so that stored blocks match request prompts hashed by ``router.tokenize``. A stored
    block whose parent we never saw (events lost, or stored before we subscribed) cannot
    be placed in our chain and is skipped: the index then under-reports, which is safe.

    Args:
        block_size: the project's block size in tokens; None = take each event's own.
    """

    def __init__(self, block_size: int | None = None) -> None:
        self.block_size = block_size
        self._ours: dict[str, dict[Hashable, int]] = {}

    def mapped_blocks(self, instance: str) -> int:
        """Number of vLLM block hashes currently mapped for ``instance``."""
        return len(self._ours.get(instance, ()))

    def clear(self, instance: str) -> None:
        """Forget ``instance``'s mapping (its cache was reset, or events were lost)."""
        self._ours.pop(instance, None)

    def translate(self, instance: str, events: Iterable, now: float) -> list[Event]:
        """Turn one batch of decoded vLLM events into policy events, in order."""
        ours = self._ours.setdefault(instance, {})
        out: list[Event] = []
        for ev in events:
            if isinstance(ev, _BlockStored):
                hashes = self._stored(ours, ev)
                if hashes:
                    out.append(BlocksStored(instance, tuple(hashes), now))
            elif isinstance(ev, _BlockRemoved):
                gone = [ours.pop(h) for h in ev.block_hashes if h in ours]
                if gone:
                    out.append(BlocksRemoved(instance, tuple(gone), now))
            else:
                ours.clear()
                out.append(AllBlocksCleared(instance, now))
        return out

    def _stored(self, ours: dict[Hashable, int], ev: _BlockStored) -> list[int]:
        block_size = self.block_size or ev.block_size
        if ev.block_size != block_size:
            return []  # another cache group's block size: not comparable with prompts
        parent = None
        if ev.parent_block_hash is not None:
            parent = ours.get(ev.parent_block_hash)
            if parent is None:
                return []
        hashes = chain_hashes(ev.token_ids, block_size, parent=parent)
        for vllm_hash, our_hash in zip(ev.block_hashes, hashes):
            ours[vllm_hash] = our_hash
        return hashes[: len(ev.block_hashes)]


class KvEventSubscriber:
    """Subscribe to each instance's vLLM KV event publisher and feed the policy.

    Args:
        endpoints: ``{instance: zmq endpoint}`` (``tcp://127.0.0.1:5557``).
        sink: receives ``BlocksStored`` / ``BlocksRemoved`` / ``AllBlocksCleared``.
        translator: the hash map (shared with the server, which clears it on
            ``/admin/reset_prefix_index``).
        topic: the publisher's topic (vLLM ``--kv-events-config`` ``topic``).
        on_event_batch: optional ``(instance, n_events_by_type, gap)`` hook for metrics.
        clock: the router's clock (seconds).

    Sequence numbers must rise by one per batch; a jump (lost batches) or a fall (the
    engine restarted) clears the instance: ``AllBlocksCleared`` is sent to the sink.
    """

    def __init__(
        self,
        endpoints: dict[str, str],
        sink: EventSink,
        translator: KvHashTranslator,
        *,
        topic: str = "kv-events",
        on_event_batch: Callable[[str, dict[str, int], bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.endpoints = dict(endpoints)
        self.sink = sink
        self.translator = translator
        self.topic = topic
        self.on_event_batch = on_event_batch
        self.clock = clock
        self.last_event_s: dict[str, float] = {}
        self._next_seq: dict[str, int] = {}
        self._log = _LogOnce()
        self._ctx = zmq.asyncio.Context.instance()

    async def run(self) -> None:
        """Receive from all endpoints until cancelled."""
        await asyncio.gather(*(self._run_one(i, ep) for i, ep in self.endpoints.items()))

    async def _run_one(self, instance: str, endpoint: str) -> None:
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt_string(zmq.SUBSCRIBE, self.topic)
        sock.connect(endpoint)
        try:
            while True:
                frames = await sock.recv_multipart()
                self.handle_frames(instance, frames)
        finally:
            sock.close(linger=0)

    def handle_frames(self, instance: str, frames: list[bytes]) -> None:
        """Decode one ZMQ message (topic, seq, payload) and forward its events.

        Never raises: a malformed message is dropped and logged once per instance.
        """
        now = self.clock()
        if len(frames) != 3 or len(frames[1]) != 8:
            self._log.warn(instance, "kv-frame", f"KV event message with {len(frames)} frames dropped")
            return
        seq = int.from_bytes(frames[1], "big", signed=True)
        try:
            events = decode_kv_events(frames[2])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._log.warn(instance, "kv-decode", f"undecodable KV event batch dropped ({exc})")
            return
        expected = self._next_seq.get(instance)
        gap = expected is not None and seq != expected
        self._next_seq[instance] = seq + 1
        if gap:
            self._log.warn(instance, "kv-gap", f"KV event sequence jumped {expected} -> {seq}; prefix index cleared")
            self.translator.clear(instance)
            self.sink(AllBlocksCleared(instance, now))
        counts: dict[str, int] = {}
        for ev in events:
            kind = type(ev).__name__.lstrip("_")
            counts[kind] = counts.get(kind, 0) + 1
        for event in self.translator.translate(instance, events, now):
            self.sink(event)
        self.last_event_s[instance] = now
        if self.on_event_batch is not None:
            self.on_event_batch(instance, counts, gap)
