"""Router replicas share their PD prefill books (``prfaas_core.policy.replica_books``): a replica counts the
others' local prefills in its queues as it counts its own, as soon as it hears of them, never twice (the engine's
scraped count is read beyond every book it holds), and forgets a replica it no longer hears from.
Real Runtime and the real wire model, no sockets (the transport has its own test, over HTTP)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError
from test_router_replica_queues import runtime

from prfaas_core.api import ReplicaBooksWire
from prfaas_core.policy.engine_load import EngineLoad
from prfaas_core.policy.replica_books import EXPIRY_S, Book, InstanceBook, ReplicaBooks
from prfaas_router.state.peers import from_wire, parse_peers_dns, to_wire


def book(replica: str, seq: int, **instances: tuple[int, int, float]) -> Book:
    return Book(replica, seq, {name: InstanceBook(*i) for name, i in instances.items()})


def test_the_newest_book_of_each_replica_counts_until_it_expires() -> None:
    books = ReplicaBooks()
    assert books.heard(book("a", 2, pd0=(1, 5, 4.0)), now=0.0)
    assert not books.heard(book("a", 1, pd0=(3, 5, 12.0)), now=0.1)  # late and older: ignored
    assert books.heard(book("b", 7, pd0=(1, 1, 2.0), pd1=(2, 2, 6.0)), now=0.2)
    assert books.seconds("pd0", now=1.0) == 6.0 and books.in_flight("pd0", now=1.0) == 2
    assert books.seconds("pd1", now=1.0) == 6.0 and books.seconds("pd2", now=1.0) == 0.0
    # "a" goes silent; "b" keeps sending
    assert books.heard(book("b", 8, pd0=(0, 1, 0.0), pd1=(2, 2, 6.0)), now=EXPIRY_S)
    assert books.seconds("pd0", now=EXPIRY_S + 0.01) == 0.0  # a's 4 s expired with it
    assert [b.replica for b in books.live(EXPIRY_S + 0.01)] == ["b"]
    # a heartbeat (the same book again) keeps a replica live past the expiry of its last change
    assert books.heard(book("b", 8, pd0=(0, 1, 0.0), pd1=(2, 2, 6.0)), now=2 * EXPIRY_S - 0.01)
    assert books.seconds("pd1", now=2 * EXPIRY_S + 0.5) == 6.0
    # a replica restarted under the same id (it never does: ids are new at each start) would be taken once expired
    assert books.heard(book("a", 1, pd0=(1, 1, 4.0)), now=2 * EXPIRY_S + 0.6)


def test_a_scrape_counts_each_peers_prefills_it_may_have_seen_once() -> None:
    books = ReplicaBooks()
    books.heard(book("a", 1, pd0=(2, 10, 8.0)), now=0.0)
    books.heard(book("b", 1), now=0.0)  # b never prefilled on pd0
    mark = books.mark("pd0", now=0.0)
    # during the scrape: a finished one and started two; b started its first; c was first heard
    books.heard(book("a", 2, pd0=(3, 12, 12.0)), now=0.1)
    books.heard(book("b", 2, pd0=(1, 1, 4.0)), now=0.1)
    books.heard(book("c", 1, pd0=(5, 5, 20.0)), now=0.1)
    assert books.seen("pd0", mark, now=0.2) == (2 + 2) + (0 + 1)  # c's work: its engine count stands for it


def test_a_runtime_counts_its_peers_books_in_its_queues_and_routes_around_them() -> None:
    rt = runtime()
    idle = {"pd-0": EngineLoad(), "pd-1": EngineLoad()}
    rt.snapshot = replace(rt.snapshot, engines=idle)
    assert rt.local_wait_s() == 0.0
    # a peer replica sent a long prefill to pd-0 a moment ago: no scrape has seen it yet
    rt.peer_books.heard(book("peer", 1, **{"pd-0": (1, 1, 9.0)}), rt.clock())
    assert rt.queued_work_s("pd-0", idle["pd-0"]) == 9.0
    assert rt.route(20_000, []).prefill.name == "pd-1"  # type: ignore[union-attr]
    # the next scrape sees it running there, and this router knows it is the peer's: counted once
    mark = rt.own_mark("pd-0")
    scraped = EngineLoad(True, 0, 1, own=rt.own_seen("pd-0", mark))
    assert scraped.own == 1 and rt.queued_work_s("pd-0", scraped) == 9.0
    # both instances busy with the peer's work: the local alternative waits
    rt.peer_books.heard(book("peer", 2, **{"pd-0": (1, 1, 9.0), "pd-1": (1, 1, 3.0)}), rt.clock())
    assert rt.local_wait_s() == 3.0


def test_own_books_change_with_every_prefill_and_reach_the_wire_intact() -> None:
    rt = runtime()
    changes: list[int] = []
    rt.books_changed = lambda: changes.append(rt.own_book().seq)
    with rt.prefill_queued("pd-0", 4.0):
        mine = rt.own_book()
        assert mine.instances == {"pd-0": InstanceBook(1, 1, 4.0)} and mine.replica == rt.replica
    assert changes == [1, 2] and rt.own_book().instances["pd-0"] == InstanceBook(0, 1, 0.0)
    wire = to_wire(mine).model_dump(by_alias=True)
    assert wire["instances"]["pd-0"] == {"inFlight": 1, "started": 1, "seconds": 4.0}
    assert from_wire(ReplicaBooksWire.model_validate(wire)) == mine


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"replica": "", "seq": 1}, "replica"),
        ({"replica": "a", "seq": -1}, "seq"),
        ({"replica": "a", "seq": 1, "instances": {"pd-0": {"inFlight": 1, "started": 1, "seconds": -2}}}, "seconds"),
        ({"replica": "a", "seq": 1, "extra": True}, "extra"),
    ],
)
def test_a_malformed_book_is_refused_naming_its_field(body: dict[str, object], where: str) -> None:
    with pytest.raises(ValidationError, match=where):
        ReplicaBooksWire.model_validate(body)


def test_peers_dns_wants_a_name_and_a_port() -> None:
    assert parse_peers_dns("prfaas-router-peers.prfaas.svc:8080") == ("prfaas-router-peers.prfaas.svc", 8080)
    assert parse_peers_dns("") is None
    for bad in ("prfaas-router-peers", ":8080", "host:http", "host:0"):
        with pytest.raises(ValueError, match="NAME:PORT"):
            parse_peers_dns(bad)
