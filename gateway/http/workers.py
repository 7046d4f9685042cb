"""One worker of `kvgate serve --workers N`: who it is, and how it reaches the worker that ingests KV events.

Worker 0 is the ingesting worker: it alone runs the ledger's KV-event subscribers and periodic passes and the
isolation canary's schedule, so each event source is read once per host. It also answers on a private Unix
socket (in a directory only the gateway's user can enter); the other workers forward the admin routes whose
answer lives in its memory (the audit with its unflushed batches and clock offsets, the canary with its
summary) there, with the caller's own credentials, so every worker gives the ingesting worker's answer.

User salts (`isolation: user`) are issued by whichever worker serves the request, but only worker 0 reads the
KV events their blocks produce, usually within milliseconds. The store alone would tell it too late (the
sibling's batch flush, then its own refresh), and those blocks would be `unattributed`. So a worker announces
each salt digest it issues to worker 0 on a private datagram socket, before the request goes upstream (a
non-blocking send into worker 0's queue), and worker 0 reads its queue before it applies each batch of events.
If the send fails (worker 0 restarting with a full queue), it is counted and the store still carries the salt.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from gateway.asgi.io import Scope
from gateway.errors import ServiceUnavailable
from gateway.ledger.records import SaltDigestEntry
from gateway.ledger.service import LedgerService
from gateway.log import get_logger
from gateway.proxy.smallcalls import SmallCalls, client_error
from gateway.routes import Local

if TYPE_CHECKING:
    import aiohttp

log = get_logger(__name__)
INGESTING_WORKER = 0
FORWARDED_HEADERS = frozenset({b"authorization", b"x-api-key", b"content-type"})
FORWARD_TIMEOUT_S = 120.0  # an audit over a large store can take a while; the caller's own timeout still applies
# Routes whose answer depends on the ingesting worker's memory.
INGESTER_ROUTES = frozenset({Local.AUDIT, Local.CANARY})

Answer = tuple[int, bytes, list[tuple[bytes, bytes]]]


@dataclass(frozen=True)
class WorkerRole:
    index: int
    count: int
    ingester_socket: Path  # worker 0 answers here too; the others forward INGESTER_ROUTES to it
    salt_socket: Path  # worker 0's datagram queue of salt digests issued by the others
    replaced: bool = False  # started in place of a worker that exited
    salt_inbox_fd: int | None = None  # worker 0: its end of that queue
    parent_pid: int | None = None  # the supervising parent

    @property
    def ingests(self) -> bool:
        return self.index == INGESTING_WORKER

    @property
    def header(self) -> tuple[bytes, bytes]:
        return b"x-kvgate-worker", str(self.index).encode()

    def reload_everywhere(self) -> None:
        """Ask the supervising parent to pass a reload (SIGHUP) on to every worker (never another process that
        has become this one's parent because the supervisor died)."""
        if self.parent_pid is not None and os.getppid() == self.parent_pid:
            os.kill(self.parent_pid, signal.SIGHUP)


class IngesterUnavailable(ServiceUnavailable):
    """The ingesting worker (restarting, or not answering) cannot answer a forwarded audit or canary now."""


class IngesterClient:
    """Forwards an admin request unchanged (method, path, query, credentials) to the ingesting worker."""

    def __init__(self, socket_path: Path) -> None:
        self._calls = SmallCalls(lambda: _ingester_session(socket_path))  # opened by the first forwarded route

    async def forward(self, scope: Scope) -> Answer:
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        query: bytes = scope.get("query_string", b"")
        target = raw_path.decode("latin-1") + (f"?{query.decode('latin-1')}" if query else "")
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]
                   if name.lower() in FORWARDED_HEADERS}
        session = await self._calls.session()
        try:
            async with session.request(scope["method"], f"http://ingester{target}", headers=headers) as reply:
                body = await reply.read()
                content_type = reply.headers.get("content-type", "application/json")
                return reply.status, body, [(b"content-type", content_type.encode("latin-1"))]
        except (client_error(), TimeoutError) as error:
            log.warning("ingester_unreachable", error=repr(error)[:300])
            raise IngesterUnavailable("The worker that keeps the ledger is not answering now; try again.",
                                      code="ingester_unavailable") from None

    async def close(self) -> None:
        await self._calls.close()


def _ingester_session(socket_path: Path) -> aiohttp.ClientSession:
    import aiohttp

    return aiohttp.ClientSession(
        connector=aiohttp.UnixConnector(path=str(socket_path)),
        timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S), auto_decompress=False)


SaltMessage = tuple[str, int, bytes]
MAX_DRAIN = 100_000  # datagrams read before one batch is applied (the socket's buffer holds far fewer)


class SaltAnnouncer:
    """A non-ingesting worker's side: one datagram per salt digest it issues."""

    def __init__(self, path: Path, failed: Callable[[], None]) -> None:
        self._path = str(path)
        self._failed = failed
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.setblocking(False)

    def announce(self, entry: SaltDigestEntry) -> None:
        try:
            self._socket.sendto(msgspec.msgpack.encode((entry.tenant, entry.epoch, entry.digest)), self._path)
        except OSError as error:  # queue full, or worker 0 not there: the store carries the salt, later
            self._failed()
            log.warning("salt_announcement_failed", error=type(error).__name__)

    def close(self) -> None:
        self._socket.close()


class SaltInbox:
    """The ingesting worker's side: every digest queued so far, read without waiting."""

    def __init__(self, fd: int) -> None:
        self._socket = socket.socket(fileno=fd)
        self._socket.setblocking(False)
        self._decoder = msgspec.msgpack.Decoder(SaltMessage)

    def drain(self) -> list[SaltDigestEntry]:
        entries: list[SaltDigestEntry] = []
        for _ in range(MAX_DRAIN):
            try:
                data = self._socket.recv(4096)
            except BlockingIOError:
                break
            try:
                tenant, epoch, digest = self._decoder.decode(data)
            except msgspec.DecodeError:  # only sibling workers can reach this socket; never expected
                log.warning("salt_announcement_undecodable", size=len(data))
                continue
            entries.append(SaltDigestEntry(tenant, epoch, digest))
        return entries

    def close(self) -> None:
        self._socket.close()


class SiblingSalts:
    """Connects a worker's ledger to its siblings: worker 0 learns the digests queued for it before each batch
    of events; every other worker announces each digest it issues."""

    def __init__(self, role: WorkerRole, ledger: LedgerService, failed: Callable[[], None]) -> None:
        self.inbox = SaltInbox(role.salt_inbox_fd) if role.salt_inbox_fd is not None else None
        self.announcer = None if role.ingests else SaltAnnouncer(role.salt_socket, failed)
        inbox, announcer = self.inbox, self.announcer
        if inbox is not None:
            ledger.ingest.before_batch = lambda: ledger.salts.learn(inbox.drain())
        if announcer is not None:
            ledger.salts.issued = announcer.announce

    def close(self) -> None:
        for end in (self.announcer, self.inbox):
            if end is not None:
                end.close()
