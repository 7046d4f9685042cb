"""One subscriber task per KV-event source the policy set names, kept running and re-planned on reload."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from gateway.kvevents.endpoints import SourceSpec, plan_sources
from gateway.kvevents.sequence import Cursor
from gateway.kvevents.subscriber import BatchSink, Subscriber, SubscriberTiming
from gateway.ledger.lifecycle import LedgerState
from gateway.ledger.observe import LedgerMetrics
from gateway.log import get_logger
from gateway.policy.loader import PolicySet
from gateway.tasks import TaskSupervisor, cancel_and_wait

if TYPE_CHECKING:
    import zmq.asyncio

log = get_logger(__name__)
RESUBSCRIBE_DELAY_S = 1.0


class SourceSubscriptions:
    """Source name -> its subscriber task; each resumes from the cursor of the last batch it handled."""

    def __init__(self, sink: BatchSink, state: LedgerState, timing: SubscriberTiming, tasks: TaskSupervisor,
                 metrics: LedgerMetrics) -> None:
        self.sink = sink
        self.state = state
        self.timing = timing
        self.tasks = tasks
        self.metrics = metrics
        self.cursors: dict[str, Cursor] = {}  # loaded from the store at start, kept current by the subscribers
        self._running: dict[str, tuple[SourceSpec, asyncio.Task[Any]]] = {}
        self._zmq: zmq.asyncio.Context | None = None  # opened with the first source (pyzmq stays unloaded till then)

    def plan(self, policies: PolicySet) -> None:
        """Stop subscribers whose source left or changed; start one for each new source."""
        wanted = {spec.name: spec for spec in plan_sources(policies.gateway)}
        for name, (spec, task) in list(self._running.items()):
            if wanted.get(name) != spec:
                task.cancel()
                del self._running[name]
        for name, spec in wanted.items():
            if name not in self._running:
                subscribing = self._subscribe(spec, self._context())
                self._running[name] = (spec, self.tasks.spawn(subscribing, f"kv-events:{name}"))

    async def _subscribe(self, spec: SourceSpec, context: zmq.asyncio.Context) -> None:
        """Keep one subscriber running for the source; a crash resumes from the last batch handled (whose
        continuity the new subscriber proves again)."""
        while True:
            subscriber = Subscriber(spec, self.sink, self.cursors.get(spec.name), self.timing, context,
                                    silent=spec.name in self.state.silent)
            try:
                await subscriber.run()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # any failure restarts the subscriber, counted
                log.error("kv_events_subscriber_failed", source=spec.name, error=repr(error)[:300])
                self.metrics.task_restarted(f"kv-events:{spec.name}")
            finally:
                if subscriber.tracker.cursor is None:
                    self.cursors.pop(spec.name, None)  # a proven restart: the old cursor must not come back
                else:
                    self.cursors[spec.name] = subscriber.tracker.cursor
            await asyncio.sleep(RESUBSCRIBE_DELAY_S)

    def _context(self) -> zmq.asyncio.Context:
        if self._zmq is None:
            import zmq.asyncio

            self._zmq = zmq.asyncio.Context()
        return self._zmq

    async def stop(self) -> None:
        await cancel_and_wait([task for _spec, task in self._running.values()])
        self._running.clear()

    def close(self) -> None:
        """After `stop`: the ZMQ context's sockets are all closed by then."""
        if self._zmq is not None:
            self._zmq.term()
