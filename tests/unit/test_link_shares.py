"""Gateway replicas lend each other their idle share of the link (prfaas_core.policy.link_shares and the lending in
prfaas_router.gateway.pulls): whatever order pulls arrive at the replicas and end in, their pulls on the wire never sum
past the ceiling, no share is ever counted twice, and every pull gets on the wire. The transport between the
replicas here is in-process; tests/integration/test_many_routers.py runs it over HTTP."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prfaas_core.api import GatewayAdmission, RouterConfig, RouterLink
from prfaas_core.capacity.profiles import builtin_model_profiles
from prfaas_core.names import GBPS_BITS
from prfaas_core.policy.link_shares import LinkShares
from prfaas_router.gateway import pulls as admission_mod
from prfaas_router.gateway.admission import LinkAdmission, admission_for
from prfaas_router.gateway.pulls import Booking
from prfaas_router.state.metrics import RouterMetrics
from prfaas_router.state.peers import PeerLoans

LINK = RouterLink(name="a-to-b", capacity_gbps=10.0)  # cap 8 Gbps
CEILING = 8.0
TIME_SCALE = 100.0
"""Model seconds per wall second: a pull's lease (5 model s) is 50 ms."""


def model_clock() -> Callable[[], float]:
    start = time.monotonic()
    return lambda: (time.monotonic() - start) * TIME_SCALE


def test_a_share_is_lent_only_from_what_the_wire_leaves_free() -> None:
    a, b = LinkShares(2, peers=True), LinkShares(2, peers=True)
    # a pull at 5 Gbps on an 8-Gbps ceiling needs 0.625; each replica has 0.5
    assert a.need(0.0, 5.0, CEILING, 0.0) == pytest.approx(0.125)
    granted = b.lend("l1", 0.125, b.free(0.0, CEILING, 0.0), "a", until_s=10.0)
    a.borrow("l1", granted, "b")
    assert a.need(0.0, 5.0, CEILING, 0.0) == 0.0
    assert a.fraction(0.0) + b.fraction(0.0) == pytest.approx(1.0)
    # b's own 3 Gbps pull takes all of its 0.375: it has nothing left to lend
    assert b.free(3.0, CEILING, 0.0) == 0.0
    assert b.lend("l2", 0.1, b.free(3.0, CEILING, 0.0), "a", until_s=10.0) == 0.0
    # the loan's lease runs out at the lender: the share comes back there; the borrower gives it back first
    assert a.give_back(["l1"]) and not b.repaid("nope")
    assert b.expire(10.0) == ["l1"] and b.fraction(10.0) == 0.5


def test_a_loan_asked_for_again_for_the_same_answer_comes_back_to_the_lender_first() -> None:
    """A loan whose answer a slow call lost: the borrower, which never had it, asks again for the same held answer;
    the lender takes the lost loan back and lends again (before: it had nothing free until the lost loan's lease ran
    out, and both replicas' held answers waited)."""
    b = LinkShares(2, peers=True)
    assert b.lend("lost", 0.5, b.free(0.0, CEILING, 0.0), "a", until_s=100.0, held_at=1.0) == 0.5
    assert b.free(0.0, CEILING, 0.0) == 0.0
    assert b.asked_again("a", 2.0) == [] and b.asked_again("c", 1.0) == []  # another answer, another borrower
    assert b.free(0.0, CEILING, 0.0) == 0.0
    assert b.asked_again("a", 1.0) == ["lost"]
    assert b.lend("again", 0.5, b.free(0.0, CEILING, 0.0), "a", until_s=100.0, held_at=1.0) == 0.5
    assert b.fraction(0.0) == 0.0 and list(b.lent) == ["again"]
    assert not b.repaid("lost") and b.repaid("again")  # the lost loan's give-back, if it comes, finds nothing


def test_a_pull_faster_than_the_ceiling_takes_the_whole_link_or_without_peers_the_whole_share() -> None:
    with_peers, alone = LinkShares(2, peers=True), LinkShares(2, peers=False)
    assert with_peers.need(0.0, 9.0, CEILING, 0.0) == pytest.approx(0.5)  # all of the other half
    assert alone.need(0.0, 9.0, CEILING, 0.0) == 0.0  # goes alone in its half: the warned, inexact case
    assert alone.need(4.0, 1.0, CEILING, 0.0) > 0  # but never next to another pull


class InProcess(PeerLoans):
    """The replicas' calls, in-process: a yield to the event loop stands for the network."""

    def __init__(self, replicas: dict[str, LinkAdmission], clock: Callable[[], float], lost: float = 0.0) -> None:
        self.urls = list(replicas)
        self.replicas = replicas
        self.clock = clock
        self.self_urls: set[str] = set()
        self.ids: dict[str, str] = {}
        self.lost = lost
        self.rng = random.Random(7)

    async def ask(self, url, link, fraction, lease_s, replica, held_at):  # type: ignore[no-untyped-def]
        peer = self.replicas[url]
        if peer.replica == replica:
            self.self_urls.add(url)
            return None
        await asyncio.sleep(0)
        if self.rng.random() < self.lost / 2:
            return None  # unreachable
        loan = peer.lend(replica, fraction, lease_s, held_at, self.clock())
        await asyncio.sleep(0)
        if self.rng.random() < self.lost / 2:
            return None  # the answer was lost: the loan comes back by its lease
        return loan

    async def give_back(self, url, link, loan_id):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        if self.rng.random() < self.lost:
            return False  # a lost give-back: the loan returns by its lease
        return self.replicas[url].repaid(loan_id, self.clock())


def _replicas(n: int, clock: Callable[[], float], lost: float = 0.0) -> list[LinkAdmission]:
    spec = GatewayAdmission.model_validate(
        {"link": "a-to-b", "replicas": n, "pullGbps": 5.0, "peers": [f"http://gw-{i}" for i in range(n)]}
    )
    reps = {f"http://gw-{i}": LinkAdmission(spec, LINK, TIME_SCALE, metrics=RouterMetrics()) for i in range(n)}
    for adm in reps.values():
        adm.peers = InProcess(reps, clock, lost)
    return list(reps.values())


@settings(max_examples=20)
@given(
    n=st.integers(2, 3),
    pulls=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 6)), min_size=2, max_size=12),
    lost=st.sampled_from([0.0, 0.3]),
)
def test_replicas_pulls_on_the_wire_never_pass_the_ceiling_and_all_get_on(n, pulls, lost) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        clock = model_clock()
        reps = _replicas(n, clock, lost)
        peak = [0.0]

        def check() -> None:
            total = sum(r.on_wire_gbps() for r in reps)
            peak[0] = max(peak[0], total)
            assert total <= CEILING + 1e-9, [r.on_wire_gbps() for r in reps]
            assert sum(r.shares.fraction(clock()) for r in reps) <= 1.0 + 1e-9

        async def one(i: int, where: int, ticks: int) -> None:
            adm = reps[where % n]
            booking = adm.decide(f"p{i}", {}, 5.0 * GBPS_BITS / 8.0, 0.1, clock())
            assert isinstance(booking, Booking)
            key = await adm.release(booking, True, clock)
            assert key is not None
            check()
            for _ in range(ticks):
                await asyncio.sleep(0)
                check()
            assert adm.pulled(key), "the pull's lease ran out before its report"
            check()

        tasks = [asyncio.create_task(one(i, w, t)) for i, (w, t) in enumerate(pulls)]
        done, _ = await asyncio.wait(tasks, timeout=60)
        for t in done:
            t.result()
        assert len(done) == len(tasks), "a pull never got on the wire"
        assert peak[0] == pytest.approx(5.0)  # 5 + 5 > 8: never two at once, across replicas

    # held answers re-check every RECHECK_S and lost loans come back LOAN_GRACE_WALL_S after their lease: short
    # here; a pull's lease (LEASE_GRACE_S + 3 x 1 s model, no wall grace) stays ~250 ms of wall time, so a slow
    # machine's stall between a pull's start and its report does not end it first, while a loan whose answer was
    # lost comes back within the engine's KV lease
    mod = admission_mod
    old = mod.RECHECK_S, mod.LOAN_GRACE_WALL_S, mod.LEASE_GRACE_S, mod.LEASE_GRACE_WALL_S
    mod.RECHECK_S, mod.LOAN_GRACE_WALL_S, mod.LEASE_GRACE_S, mod.LEASE_GRACE_WALL_S = 0.002, 0.01, 22.0, 0.0
    try:
        asyncio.run(main())
    finally:
        mod.RECHECK_S, mod.LOAN_GRACE_WALL_S, mod.LEASE_GRACE_S, mod.LEASE_GRACE_WALL_S = old


def test_a_replica_that_finds_itself_among_its_peers_skips_itself_and_metrics_count_the_loans() -> None:
    async def main() -> None:
        now = [0.0]
        a, b = _replicas(2, lambda: now[0])
        booking = a.decide("x", {}, 5.0 * GBPS_BITS / 8.0, 0.1, 0.0)
        assert isinstance(booking, Booking)
        key = await a.release(booking, True, lambda: now[0])
        assert a.peers is not None and a.peers.self_urls == {"http://gw-0"}
        assert a.shares.fraction(0.0) == pytest.approx(0.625) and b.shares.fraction(0.0) == pytest.approx(0.375)
        m = a.metrics.gateway_loans  # type: ignore[union-attr]
        assert m.labels("a-to-b", "borrowed")._value.get() == 1
        assert b.metrics.gateway_loans.labels("a-to-b", "lent")._value.get() == 1  # type: ignore[union-attr]
        now[0] = 1.5  # its 5 Gbit took 1 s at 5 Gbps: reported after that, it leaves the wire at once
        assert a.pulled(key or "") and a.on_wire_gbps() == 0.0
        for _ in range(5):
            await asyncio.sleep(0)
        assert a.shares.fraction(0.0) == 0.5 and b.shares.fraction(0.0) == 0.5  # given back
        share = b.metrics.gateway_link_share.labels("a-to-b")._value.get()  # type: ignore[union-attr]
        assert share == 0.5

    asyncio.run(main())


def test_a_pull_reported_sooner_than_its_bytes_take_counts_on_the_wire_until_then() -> None:
    """A wire faster than booked: the report comes early, but the next pull must not start before the bytes would
    have crossed at the pull's rate, or pulls bunch up past the cap in the link's 1-s windows."""

    async def main() -> None:
        now = [0.0]
        spec = GatewayAdmission.model_validate({"link": "a-to-b", "pullGbps": 5.0})
        adm = LinkAdmission(spec, LINK, time_scale=100.0, metrics=RouterMetrics())
        a, b = (adm.decide(k, {}, 5.0 * GBPS_BITS / 8.0, 0.1, 0.0) for k in "ab")
        assert isinstance(a, Booking) and isinstance(b, Booking)
        key = await adm.release(a, True, lambda: now[0])
        held = asyncio.create_task(adm.release(b, True, lambda: now[0]))
        now[0] = 0.2  # reported 0.2 s in, its 5 Gbit at 5 Gbps take 1 s
        assert adm.pulled(key or "") and not adm.pulled(key or "")  # counted once
        assert adm.on_wire_gbps() == 5.0 and not held.done()
        assert adm.metrics.gateway_pulls.labels("a-to-b", "reported")._value.get() == 1  # type: ignore[union-attr]
        now[0] = 1.0  # the clock reaches its earliest end; the timer (0.8 s model = 8 ms) lets b on
        assert await asyncio.wait_for(held, 5.0) == "b"
        assert list(adm._on_wire) == ["b"]

    asyncio.run(main())


def _gateway_config(**admission: object) -> RouterConfig:
    return RouterConfig.model_validate(
        {
            "mode": "gateway",
            "pdCluster": "pd",
            "thresholdMinTokens": 0,
            "model": builtin_model_profiles()["internal-1t"],
            "endpoints": [{"name": "prf-0", "url": "http://127.0.0.1:1", "role": "prefill"}],
            "gateway": {"prefillCluster": "prfaas", "admission": {"link": "a-to-b", "pullGbps": 5.0, **admission}},
            "links": [{"name": "a-to-b", "capacityGbps": 10.0}],
        }
    )


def test_a_config_reload_keeps_the_pulls_on_the_wire_and_takes_the_new_spec() -> None:
    async def main() -> None:
        site = admission_for(_gateway_config(), None)
        assert site is not None
        adm = site.of(None)  # the link's admission (the config's gateway.admission.link)
        assert isinstance(adm, LinkAdmission)
        booking = adm.decide("a", {}, 5.0 * GBPS_BITS / 8.0, 0.1, 0.0)
        assert isinstance(booking, Booking)
        key = await adm.release(booking, True, lambda: 0.0)

        def reloaded(config: RouterConfig) -> object:
            nonlocal site
            site = admission_for(config, site)
            assert site is not None
            return site.of(None)

        assert reloaded(_gateway_config()) is adm  # nothing changed: the same link admission
        two = _gateway_config(replicas=2, peers=["http://127.0.0.1:1", "http://127.0.0.1:2"])
        assert reloaded(two) is adm and adm.on_wire_gbps() == 5.0  # the pull still counts: the next waits for it
        assert adm.shares.base == 0.5 and adm.peers is not None and adm.params.capacity_gbps == 5.0
        assert adm.pulled(key or "")
        assert reloaded(_gateway_config()) is adm and adm.peers is None  # peers dropped, closed
        await asyncio.sleep(0)
        with pytest.raises(ValueError, match=r"gateway\.admission\.link"):
            admission_for(_gateway_config(link="nowhere"), site)

    asyncio.run(main())


def test_an_unreadable_peer_ca_verifies_with_the_system_cas_instead_of_failing_the_gateway(tmp_path: Path) -> None:
    """The chart mounts the CA Secret optional: a missing or broken peerCaFile must not stop the gateway, nor let
    it talk to peers unverified. It falls back to the system's CAs (peers a private CA signed: unreachable)."""
    import ssl

    from prfaas_router.state.peers import peer_tls

    bad = tmp_path / "ca.crt"
    bad.write_text("-----BEGIN CERTIFICATE-----\nnot one\n-----END CERTIFICATE-----\n")
    for ca in (str(tmp_path / "absent.crt"), str(bad)):
        ctx = peer_tls(ca)
        assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
        assert ctx.cert_store_stats() == ssl.create_default_context().cert_store_stats()
