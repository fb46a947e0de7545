"""Gateway replicas' shares of one link, lent between them so that their pulls on the wire never sum past the
ceiling, whichever replica a pull passes through.

Each of N replicas starts with ``1 / N`` of the link's ceiling. A replica whose next pull does not fit in its share
borrows the missing fraction from its peers; a lender gives only what its own pulls on the wire leave free, and
takes it out of its own share *before* it answers, so at every instant the shares of all replicas sum to at most 1
(a loan in flight is counted by the lender alone). The borrower gives a loan back when the pull it was taken for is
over; the lender takes it back by itself when the loan's lease runs out (the borrower died or lost the way back), and
that lease is longer than the borrower's pull lease, which starts later. A borrower asks each peer once per try, for
its oldest held answer, and gives back what it got when the try falls short: an ask again for the same answer means
the earlier loans for it are not in use (their answer was lost on the way, or their give-back is), and the lender
takes them back at once (:meth:`LinkShares.asked_again`; before, a loan whose answer a slow call lost kept the
lender's share until its lease ran out while the borrower, refused, waited for it: both replicas' pulls stalled).
A replica that cannot reach its peers only has its own share: exact still, just slower. A peer that did not answer a
loan call (hung, refused, gone) is counted down; once every peer's every call failed for :data:`PEER_DOWN_S`, the
replica is ``cut_off`` and keeps to its own share as a replica without peers does (a pull faster than the share goes
alone in it, after its loan calls failed once more): it serves on, where it once waited for loans until its held
answers' KV lease ran out. A peer that is merely slow or lossy (any call answered) cuts nothing off: the shares stay
exact.

Pure bookkeeping in model seconds; the router's ``prfaas_router.gateway.admission`` does the calls between replicas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

EPS = 1e-9
PEER_DOWN_S = 5.0
"""A replica whose every loan call to every peer failed for this long (wall seconds; a call waits at most
``prfaas_router``'s ``PEER_TIMEOUT_S``) is cut off: it serves on its own share, as without peers."""


@dataclass(frozen=True)
class Loan:
    fraction: float
    """Of the whole link's ceiling."""
    peer: str
    """The other replica: the borrower's id on the lender's side, the lender's URL on the borrower's."""
    until_s: float = float("inf")
    """Lender's side: when the fraction comes back by itself."""
    held_at: float | None = None
    """Lender's side: the borrower's held answer it was asked for (when held, Unix time)."""


@dataclass
class LinkShares:
    """One replica's share of the link: its base ``1 / replicas``, less what it lent, plus what it borrowed."""

    replicas: int = 1
    peers: bool = False
    """Whether the replica can borrow (peers configured): without, a pull faster than the share goes alone in it."""
    lent: dict[str, Loan] = field(default_factory=dict)
    borrowed: dict[str, Loan] = field(default_factory=dict)
    down_since: dict[str, float] = field(default_factory=dict)
    """Peers whose every call failed lately: URL -> when the streak began (the caller's clock, wall seconds)."""
    cut_off: bool = False
    """Every peer is down (:meth:`is_cut_off`): the replica keeps to its own share, as without peers."""

    def peer_failed(self, url: str, now: float) -> None:
        self.down_since.setdefault(url, now)

    def peer_answered(self, url: str) -> None:
        self.down_since.pop(url, None)

    def is_cut_off(self, urls: list[str], now: float) -> bool:
        """Whether every peer in ``urls`` has failed every call for :data:`PEER_DOWN_S` (hung, refused, gone)."""
        return bool(urls) and all(now - self.down_since.get(u, math.inf) >= PEER_DOWN_S for u in urls)

    @property
    def base(self) -> float:
        return 1.0 / self.replicas

    def expire(self, now_s: float) -> list[str]:
        """Take back the loans whose lease ran out; their ids."""
        gone = [k for k, loan in self.lent.items() if loan.until_s <= now_s]
        for k in gone:
            del self.lent[k]
        return gone

    def fraction(self, now_s: float) -> float:
        """This replica's share of the link's ceiling now."""
        self.expire(now_s)
        own = self.base - sum(x.fraction for x in self.lent.values()) + sum(x.fraction for x in self.borrowed.values())
        return min(1.0, max(0.0, own))

    def need(self, on_wire_gbps: float, rate_gbps: float, ceiling_gbps: float, now_s: float) -> float:
        """The fraction this replica misses for a pull at ``rate_gbps`` to go on the wire now (0: it fits).

        A pull faster than the whole ceiling goes alone: it needs the whole link (without peers, the whole share),
        or no such pull would ever run."""
        have = self.fraction(now_s)
        alone = 1.0 if self.peers and not self.cut_off else self.base
        if on_wire_gbps <= EPS and (ceiling_gbps <= EPS or rate_gbps > ceiling_gbps * alone):
            want = alone
        elif ceiling_gbps <= EPS:
            want = float("inf")
        else:
            want = (on_wire_gbps + rate_gbps) / ceiling_gbps
        return max(0.0, want - have) if want - have > EPS else 0.0

    def free(self, on_wire_gbps: float, ceiling_gbps: float, now_s: float) -> float:
        """The fraction this replica could lend: its share less what its pulls on the wire use."""
        used = 1.0 if ceiling_gbps <= EPS and on_wire_gbps > EPS else on_wire_gbps / max(ceiling_gbps, EPS)
        return max(0.0, self.fraction(now_s) - used)

    def asked_again(self, borrower: str, held_at: float) -> list[str]:
        """``borrower`` asks for its answer held since ``held_at`` again: the loans lent for that answer are not in
        use (their answer or their give-back was lost on the way) and come back now; their ids."""
        again = [k for k, loan in self.lent.items() if loan.peer == borrower and loan.held_at == held_at]
        for k in again:
            del self.lent[k]
        return again

    def lend(
        self, loan_id: str, wanted: float, free: float, borrower: str, until_s: float, held_at: float | None = None
    ) -> float:
        """Lend up to ``wanted`` of ``free`` (for the borrower's answer held since ``held_at``); the granted
        fraction (0: nothing lent)."""
        granted = min(max(0.0, wanted), free)
        if granted <= EPS:
            return 0.0
        self.lent[loan_id] = Loan(granted, borrower, until_s, held_at)
        return granted

    def repaid(self, loan_id: str) -> bool:
        """The borrower gave ``loan_id`` back; False when it is not out (unknown, or its lease ran out)."""
        return self.lent.pop(loan_id, None) is not None

    def borrow(self, loan_id: str, fraction: float, lender: str) -> None:
        self.borrowed[loan_id] = Loan(fraction, lender)

    def give_back(self, loan_ids: list[str]) -> list[tuple[str, Loan]]:
        """Stop using ``loan_ids`` (before telling their lenders); the loans, to return."""
        return [(k, loan) for k in loan_ids if (loan := self.borrowed.pop(k, None)) is not None]
