"""The PD prefill books router replicas share, so each sees the others' local prefills as it sees its own.

A router books each local prefill it sends to a PD prefill instance (its predicted seconds, while it runs). With
several router replicas in front of one PD cluster, each used to see only its own books exactly and the others'
work only through the engines' scraped ``waiting + running`` counts, one scrape late: two replicas would pick the
same idle instance at once, and queue surges went unseen (3 replicas reached 0.57x one router's goodput). Each
replica now sends its books to the others whenever they change and at a heartbeat (``prfaas_router.state.peers``,
:data:`~prfaas_core.names.REPLICA_BOOKS_PATH`); a replica not heard from for :data:`EXPIRY_S` counts for nothing
(its engines' counts still do). Like Dynamo's router replica sync, but peer to peer over HTTP, no message bus.

Pure: the clock is passed in; the transport lives in the router.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

EXPIRY_S = 3.0
"""Wall seconds after which a replica's last books no longer count (three heartbeats missed)."""
HEARTBEAT_S = 1.0
"""Wall seconds between two sends of unchanged books (a changed book goes at once)."""
MAX_BOOK_BYTES = 256 * 1024
"""A peer's book body is at most this many bytes (a book names only this router's own PD prefill instances: a few
dozen bytes each; 256 KiB holds thousands)."""
MAX_PEER_REPLICAS = 256
"""At most this many other replicas' books are held at once: a new sender past it is refused until one expires."""


@dataclass(frozen=True)
class InstanceBook:
    """One replica's local prefills on one PD prefill instance."""

    in_flight: int = 0
    started: int = 0
    """Ever started (monotonic: with ``in_flight``, which of them a scrape may have counted)."""
    seconds: float = 0.0
    """Predicted prefill seconds (model time) of those in flight."""


@dataclass(frozen=True)
class Book:
    """One replica's books as it sent them: ``seq`` grows with every change (a late, older book is ignored)."""

    replica: str
    seq: int
    instances: Mapping[str, InstanceBook]


Mark = Mapping[str, tuple[int, int]]
"""Per replica, where its prefills on one instance stood as a scrape began: (in flight, ever started)."""


@dataclass
class ReplicaBooks:
    """The other replicas' books as last heard (keyed by replica id)."""

    expiry_s: float = EXPIRY_S
    _books: dict[str, tuple[float, Book]] = field(default_factory=dict)

    def room_for(self, replica: str, now: float, limit: int = MAX_PEER_REPLICAS) -> bool:
        """Whether a book from ``replica`` may be held: it is held already, or fewer than ``limit`` live ones are."""
        return replica in self._books or len(self.live(now)) < limit

    def heard(self, book: Book, now: float) -> bool:
        """Take ``book`` unless a newer one from its replica is held (a late body); True when taken. An unchanged
        book (a heartbeat: the same ``seq``) keeps its replica live."""
        held = self._books.get(book.replica)
        if held is not None and held[1].seq > book.seq and now - held[0] < self.expiry_s:
            return False
        self._books[book.replica] = (now, book)
        return True

    def live(self, now: float) -> list[Book]:
        """The books heard from within :attr:`expiry_s`; older ones are dropped."""
        for replica in [r for r, (at, _) in self._books.items() if now - at >= self.expiry_s]:
            del self._books[replica]
        return [book for _, book in self._books.values()]

    def seconds(self, instance: str, now: float) -> float:
        """The other replicas' predicted prefill seconds in flight on ``instance``."""
        if not self._books:  # a lone replica (the common case): nothing to expire or add, on every routing view
            return 0.0
        return sum(b.instances[instance].seconds for b in self.live(now) if instance in b.instances)

    def in_flight(self, instance: str, now: float) -> int:
        return sum(b.instances[instance].in_flight for b in self.live(now) if instance in b.instances)

    def mark(self, instance: str, now: float) -> Mark:
        """Where each replica stood on ``instance`` as a scrape of it begins (see :meth:`seen`)."""
        none = InstanceBook()  # a replica that never prefilled there: nothing in flight, nothing started
        return {b.replica: ((i := b.instances.get(instance, none)).in_flight, i.started) for b in self.live(now)}

    def seen(self, instance: str, mark: Mark, now: float) -> int:
        """The other replicas' prefills on ``instance`` that a scrape begun at ``mark`` may have counted: those in
        flight when it began plus those started since, for each replica heard from then and now (one that went
        silent is dropped: the engine's count then stands for it)."""
        total = 0
        for b in self.live(now):
            then = mark.get(b.replica)
            if then is None:  # first heard since the scrape began: its engine count stands for it
                continue
            total += then[0] + max(0, b.instances.get(instance, InstanceBook()).started - then[1])
        return total
