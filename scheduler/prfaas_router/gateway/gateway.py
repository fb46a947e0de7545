"""Gateway mode: the router binary in front of a PrFaaS cluster (region A), exported to region B.

One endpoint, TLS and a bearer token (never logged; :mod:`.security` checks it on every path but ``/health`` and
``/ready``, and keeps a leg's fields to the forwarding allow-list): it accepts prefill legs only (a body asking
for a KV handle, :func:`prfaas_core.launch.vllm.is_prefill_leg`), picks the PrFaaS instance (least predicted
prefill time, cache-affine) and returns the engine's answer, whose KV handle carries the KV address region B's
decode pulls from.
``/status`` serves :class:`prfaas_core.api.GatewayStatus` (ready instances, queue depth, measured egress and
prefill throughput over the last window), which region B's routers and operator read.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import structlog
from aiohttp import web

from prfaas_core import names
from prfaas_core.api import GatewayStatus
from prfaas_core.launch.kinds import engine_kind
from prfaas_core.names import GBPS_BITS
from prfaas_core.policy.decode_prefix import decode_cached_header
from prfaas_core.policy.engine_load import IDLE
from prfaas_core.policy.link_admission import verify_decode_cached
from prfaas_core.policy.routing import InstanceView
from prfaas_core.request.slo import ttft_objective_s
from prfaas_core.request.tokens import block_hashes

from ..state.config import count_prompt
from ..state.metrics import RouterMetrics
from ..state.runtime import Runtime
from ..state.security import forwarded_headers, refused_field
from ..state.wire import (
    JSON_CONTENT,
    LINK_HEADER,
    LINK_LABEL,
    UNKNOWN_LINK,
    Aborts,
    SideLost,
    engine_side,
    is_chat,
    json_bytes,
    json_error,
    reported_prompt_tokens,
    timing_header,
)
from .admission import LinkAdmission, SiteAdmission, admission_for
from .pulls import Booking, KvLeaseOver

ENGINE = engine_kind()


def engine_kv_handle(body: object) -> dict[str, Any] | None:
    """The KV handle in an engine's answer (bytes), None when it carries none or is not JSON."""
    try:
        return ENGINE.kv_handle(orjson.loads(body)) if isinstance(body, bytes) else None
    except orjson.JSONDecodeError:
        return None


log = structlog.get_logger("prfaas.gateway")

WINDOW_S = 10.0


class Gateway:
    def __init__(
        self,
        runtime: Runtime,
        http: httpx.AsyncClient,
        metrics: RouterMetrics | None = None,
        token: Callable[[], bytes | None] = lambda: None,
    ) -> None:
        self.rt = runtime
        self.token = token
        """The bearer token callers send now (:mod:`.security`'s): the replicas' calls to each other send it too."""
        self.replica = os.urandom(6).hex()
        """This process's id among its gateway peers."""
        self.http = http
        self.metrics = metrics or RouterMetrics()
        self.egress_bytes: dict[str, float] = {}
        """KV bytes served since start, by link (the status endpoint's ``kvEgressBytes``)."""
        self.served: deque[tuple[float, int, float]] = deque()  # (model time, tokens, kv bytes)
        self.aborts = Aborts()
        """Engine legs in flight, cut short when their engine turns unhealthy (then the next one is tried)."""
        self.admission: SiteAdmission | None = None
        """One link admission per link scheduled (a fleet site's share its cap)."""
        self.reload_secrets()

    def reload_secrets(self) -> None:
        """After a config reload: the link admission, reconfigured in place on the same link (the token is
        :mod:`.security`'s, reloaded on its own)."""
        old = self.admission
        self.admission = admission_for(self.rt.compiled.config, old, self.metrics, self.replica, self.token)
        kept = {id(a) for a in self.admission.all()} if self.admission is not None else set()
        for gone in old.all() if old is not None else []:
            if id(gone) not in kept and gone.peers is not None:
                gone.peers.close_soon()

    async def aclose(self) -> None:
        for adm in self.admission.all() if self.admission is not None else []:
            if adm.peers is not None:
                await adm.peers.aclose()

    async def prefill(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        raw = await request.read()
        try:
            body = orjson.loads(raw)  # a 50K-token prompt: 3 ms, where json took 9 ms of the event loop
        except orjson.JSONDecodeError as exc:
            return json_error(400, f"request body is not valid JSON: {exc}")
        if not isinstance(body, dict):
            return json_error(400, "request body must be a JSON object")
        if not ENGINE.is_prefill_leg(body):
            return json_error(400, f"the gateway serves prefill legs only: a {ENGINE.KV_HANDLE_FIELD} request")
        refused = refused_field(body, request.headers)
        if refused is not None:
            return json_error(400, refused)
        rt = self.rt
        c = rt.compiled
        try:
            ids = await count_prompt(body, is_chat(request.path), c.tokenizer, len(raw))
            decode_held = decode_cached_header(request.headers.get(names.HEADER_DECODE_CACHED_TOKENS))
        except ValueError as exc:
            return json_error(400, str(exc))
        adm = None if self.admission is None else self.admission.of(request.headers.get(names.HEADER_LINK))
        if isinstance(adm, web.Response):
            return adm
        decode_held, overclaimed = verify_decode_cached(decode_held, len(ids))
        if overclaimed and adm is not None:
            adm.claim_corrected("decode_cached")
        salt = body.get("cache_salt")  # a tenant's prompts match only its own prefixes (the engines' cache too)
        hashes = block_hashes(ids, c.config.routing.prefix_block_tokens, salt if isinstance(salt, str) else None)
        hits = rt.pd_index.match(hashes)
        booking = None
        if adm is not None:
            adm.set_lanes(self.status_model().ready_instances)
            uncached = len(ids) - max(hits.values(), default=0)
            key = adm.pull_id()  # the gateway's own id: callers sharing an x-request-id stay apart
            prefill_s = c.prfaas.prefill_seconds(float(max(uncached, 1)))
            ready = rt.policy.pick_prefill(self._views(hits, set()), len(ids), c.prfaas.prefill_seconds)
            verdict = adm.decide(
                key,
                request.headers,
                c.kv.pulled_kv_bytes(len(ids), decode_held),
                prefill_s,
                rt.model_now(),
                None if ready.name is None else ready.predicted_s,
                ttft_objective_s(c.config.slo, len(ids)) if c.config.slo is not None else None,
            )
            if isinstance(verdict, web.Response):
                return verdict
            booking = verdict
        held = started
        try:
            if booking is not None and adm is not None:
                await adm.hold(booking, rt.model_now)  # a router gone meanwhile frees its window below
            held = time.perf_counter()
            resp, instance = await self._prefill_on_instance(request, body, ids, hashes, hits, booking, adm)
        except BaseException:
            if booking is not None and adm is not None:
                await adm.release(booking, False, rt.model_now)
            raise
        prefilled = time.perf_counter()
        timings = [("hold", held - started), ("prefill", prefilled - held)]
        if booking is not None and adm is not None:
            try:
                pull_id = await adm.release(booking, resp.status == 200, rt.model_now, instance)
            except KvLeaseOver as over:  # the caller releases the KV the engine holds for it (no pull will come)
                return adm.lease_answer(over, engine_kv_handle(resp.body))
            if pull_id is not None:
                resp.headers[names.HEADER_PULL_ID] = pull_id
            timings += [
                ("release", time.perf_counter() - prefilled),
                ("predicted", booking.predicted_ttft_s / c.scale.time_scale),
            ]
        resp.headers[names.SERVER_TIMING] = timing_header(timings)
        return resp

    async def pull_done(self, request: web.Request) -> web.Response:
        """A router reports a pull over (its decode holds the KV): the link's next pull may start. A report that
        reached the wrong replica (behind one Service) is forwarded to the peer whose id the pull's id starts with."""
        pull_id = request.match_info["pull_id"]
        if self.admission is None:
            return json_error(404, "this gateway schedules no link: there are no pulls to report")
        links = self.admission.all()
        adm = next((a for a in links if a.pulled(pull_id)), None)
        if adm is None:
            adm = links[0]
            owner = pull_id.split(".", 1)[0]
            if owner != adm.replica and adm.peers is not None and names.HEADER_FORWARDED not in request.headers:
                resp = await adm.peers.report_done(pull_id)
                if resp is not None:
                    return web.Response(body=resp.content, status=resp.status_code, content_type="application/json")
            return json_error(404, f"pull {pull_id!r} is not on the wire (unknown, reported, or its lease ran out)")
        return web.json_response({"pull": pull_id, "onWireGbps": adm.on_wire_gbps()})

    async def _peer_admission_of(self, request: web.Request) -> LinkAdmission | web.Response:
        """The admission of the request's link, if the caller is one of its configured peers (403 otherwise, also on
        a gateway without peers: only the replicas of one link lend each other their shares)."""
        link = request.match_info["link"]
        adm = None if self.admission is None else self.admission.links.get(link)
        if adm is None:
            return json_error(404, f"this gateway schedules no link {link!r}")
        if adm.peers is None or not await adm.peers.is_peer(request.remote):
            adm.loan_count("not_peer")
            why = (
                "this gateway has no peers (gateway.admission.peers): it lends to nobody"
                if adm.peers is None
                else f"caller {request.remote} is not one of gateway.admission.peers: only they may borrow"
            )
            log.warning("share loan refused", link=link, caller=request.remote, why=why)
            return json_error(403, why, "permission_error")
        return adm

    async def lend(self, request: web.Request) -> web.Response:
        """A peer replica asks for part of this replica's share of the link (``LOANS_PATH``): only a configured peer,
        within ``loanMaxFraction`` and ``loanMaxLeaseSeconds`` (400 naming the field), logged and counted."""
        adm = await self._peer_admission_of(request)
        if isinstance(adm, web.Response):
            return adm
        try:
            body = orjson.loads(await request.read())
            wanted, lease_s = float(body["fraction"]), float(body["leaseS"])
            borrower, held_at = str(body["replica"]), float(body["heldAt"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return json_error(400, f"a loan request needs fraction, leaseS, heldAt (numbers) and replica: {exc}")
        if not (0 < wanted <= 1 and 0 <= lease_s < 86_400 and math.isfinite(held_at)):
            return json_error(400, "fraction must be in (0, 1], leaseS in [0, 86400) and heldAt a Unix time")
        spec = adm.spec
        bound = None
        if wanted > spec.max_loan_fraction() + 1e-9:
            bound = f"fraction {wanted:g} is over gateway.admission.loanMaxFraction ({spec.max_loan_fraction():g})"
        elif lease_s / self.rt.compiled.scale.time_scale > spec.loan_max_lease_seconds * (1 + 1e-9):
            bound = (
                f"leaseS {lease_s:g} (model seconds) is over gateway.admission.loanMaxLeaseSeconds "
                f"({spec.loan_max_lease_seconds:g} wall seconds)"
            )
        if bound is not None:
            adm.loan_count("over_bounds")
            log.warning("share loan refused", link=adm.link, caller=request.remote, borrower=borrower[:64], why=bound)
            return json_error(400, bound)
        if borrower == adm.replica:
            return json_error(409, "that is this replica: it does not lend to itself")
        loan_id, granted = adm.lend(borrower, wanted, lease_s, held_at, self.rt.model_now())
        log.info(
            "share loan",
            link=adm.link,
            caller=request.remote,
            borrower=borrower[:64],
            asked=round(wanted, 4),
            granted=round(granted, 4),
            lease_s=round(lease_s, 3),
            loan=loan_id or None,
        )
        return web.json_response({"loanId": loan_id, "granted": granted, "replica": adm.replica})

    async def repay(self, request: web.Request) -> web.Response:
        """A peer gives a loan back (``LOAN_PATH``)."""
        adm = await self._peer_admission_of(request)
        if isinstance(adm, web.Response):
            return adm
        loan_id = request.match_info["loan_id"]
        if not adm.repaid(loan_id, self.rt.model_now()):
            return json_error(404, f"loan {loan_id!r} is not out (unknown, given back, or its lease ran out)")
        return web.json_response({"loanId": loan_id, "share": adm.shares.fraction(self.rt.model_now())})

    async def _prefill_on_instance(
        self,
        request: web.Request,
        body: dict[str, Any],
        ids: list[int],
        hashes: list[bytes],
        hits: dict[str, int],
        booking: Booking | None = None,
        link: LinkAdmission | None = None,
    ) -> tuple[web.Response, str | None]:
        """The prefill on the best healthy PrFaaS instance (the next one after a failure), and the instance that
        answered (None: none did). With a ``booking`` on paced instances, its pull joins the instance's egress work."""
        rt = self.rt
        adm = link if booking is not None else None
        c = rt.compiled
        tried: set[str] = set()
        last_error = "no healthy PrFaaS instance"
        payload = json_bytes(body)  # orjson: httpx's json= ran the stdlib encoder, ~10 ms for a 50K-token prompt
        for _ in range(max(1, len(c.prefill))):
            views = self._views(hits, tried)
            pick = rt.policy.pick_prefill(views, len(ids), c.prfaas.prefill_seconds)
            if pick.name is None:
                break
            tried.add(pick.name)
            if adm is not None and booking is not None:
                adm.assign(booking.key, pick.name, booking.window.bytes)
            uncached = max(0, len(ids) - hits.get(pick.name, 0))
            with rt.prefill_queued(pick.name, c.prfaas.prefill_seconds(float(uncached))):
                try:
                    resp = await self.aborts.run(
                        engine_side(pick.name),
                        self.http.post(
                            f"{c.by_name[pick.name].url}{request.path}",
                            content=payload,
                            headers={**forwarded_headers(request.headers), "Content-Type": JSON_CONTENT},
                            timeout=httpx.Timeout(
                                c.config.timeouts.prefill_seconds, connect=c.config.timeouts.connect_seconds
                            ),
                        ),
                    )
                except httpx.HTTPError as exc:
                    last_error = f"{pick.name}: {exc.__class__.__name__}"
                    continue
                except SideLost as exc:
                    last_error = f"{pick.name} turned unhealthy mid-prefill ({exc})"
                    continue
            if resp.status_code >= 500:
                last_error = f"{pick.name} answered {resp.status_code}"
                continue
            if resp.status_code == 200:
                rt.pd_index.insert(hashes, pick.name)
                decode_held = verify_decode_cached(
                    decode_cached_header(request.headers.get(names.HEADER_DECODE_CACHED_TOKENS)), len(ids)
                )[0]
                self._served(uncached, c.kv.pulled_kv_bytes(len(ids), decode_held))
                prompt = reported_prompt_tokens(resp.content, len(ids))
                self._egress(request.headers.get(LINK_HEADER), prompt, decode_held)
            answer = web.Response(body=resp.content, status=resp.status_code, content_type="application/json")
            return answer, pick.name
        why = f"prefill failed on every PrFaaS instance tried: {last_error}"
        return json_error(503, why, "service_unavailable"), None

    def _views(self, hits: dict[str, int], tried: set[str]) -> list[InstanceView]:
        """The PrFaaS instances as the pick sees them: queued prefill work, cached prefix, health (``tried`` ones
        failed this request already) and, on paced instances, their egress work
        (:meth:`LinkAdmission.egress_wait_s`)."""
        rt = self.rt
        c = rt.compiled
        now = rt.model_now()
        pulls = self.admission.all() if self.admission is not None else []
        return [
            InstanceView(
                e.name,
                queued_prefill_s=rt.queued_work_s(e.name, rt.snapshot.engines.get(e.name, IDLE)),
                cached_prefix_tokens=hits.get(e.name, 0),
                healthy=rt.snapshot.engines.get(e.name, IDLE).healthy and e.name not in tried,
                draining=e.name in c.draining,
                egress_wait_s=sum(p.egress_wait_s(e.name, now) for p in pulls),
            )
            for e in c.prefill
        ]

    def _egress(self, link: str | None, prompt_tokens: int, decode_cached: int = 0) -> None:
        """Count the KV the served prefill left for region B to pull, as the decode side will pull it
        (:meth:`~prfaas_core.capacity.kv.KvModel.pulled_kv_bytes`): the whole blocks of the prompt's pulled tokens
        (a hybrid's N-1) that the decode lacks (``decode_cached``, the router's header), plus a hybrid's state."""
        name = link if link and LINK_LABEL.fullmatch(link) else UNKNOWN_LINK
        nbytes = self.rt.compiled.kv.pulled_kv_bytes(prompt_tokens, decode_cached)
        self.metrics.gateway_egress.labels(name).inc(nbytes)
        self.egress_bytes[name] = self.egress_bytes.get(name, 0.0) + nbytes

    def _served(self, tokens: int, kv_bytes: float) -> None:
        now = self.rt.model_now()
        self.served.append((now, tokens, kv_bytes))
        while self.served and now - self.served[0][0] > WINDOW_S:
            self.served.popleft()

    def status_model(self) -> GatewayStatus:
        rt = self.rt
        now = rt.model_now()
        window = [(t, n, b) for t, n, b in self.served if now - t <= WINDOW_S]
        engines = rt.snapshot.engines
        ready = sum(
            1 for e in rt.compiled.prefill if engines.get(e.name, IDLE).healthy and e.name not in rt.compiled.draining
        )
        queue = sum(engines.get(e.name, IDLE).waiting for e in rt.compiled.prefill)
        gw = rt.compiled.config.gateway
        return GatewayStatus(
            prefill_cluster=gw.prefill_cluster if gw else rt.compiled.config.pd_cluster,
            ready_instances=ready,
            queue_depth=queue,
            egress_gbps=sum(b for _, _, b in window) * 8.0 / WINDOW_S / GBPS_BITS,
            measured_prefill_tokens_per_second=sum(n for _, n, _ in window) / WINDOW_S,
            time=datetime.now(UTC).isoformat(),
            kv_egress_bytes=dict(self.egress_bytes),
            scheduled_links=list(self.admission.links) if self.admission is not None else [],
        )

    async def status(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = self.status_model().model_dump(mode="json", by_alias=True)
        return web.json_response(body)
