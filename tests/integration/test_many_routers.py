"""Three router processes share one link and its gateway's calendar, over real sockets: a burst of long requests
from all three never takes the link's egress (the relay's own accounting, 1-s windows) above the gateway's cap,
allowing one pull's burst (a pull runs at the wire's speed, not at its booked rate), and every request is answered.
The routers' own links say 100 Gbps: only the gateway's calendar (0.1 Gbps, cap 0.08) holds them. With 2 gateway
replicas (routers 1 and 2 on one, router 3 on the other) each starts with cap / 2 and borrows the other's idle share
for a pull (one pull, at the link's 0.1 Gbps, needs the whole cap), over HTTP: the same one-pull allowance holds. A loan
whose answer a call under CPU load lost is taken back when its borrower asks again (it once kept the lender's share
for its lease, ~13 s, while both replicas' held answers waited past the routers' 10-s remote timeout: at load ~25
nothing went remote).
The routers share their PD prefill books (``--peers``, as the chart's router replicas do) throughout."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from testbed_support import GATEWAY_AUTH, PRFAAS, TIME_SCALE, counter, free_port, http, processes, start_stack, wait_for

from prfaas_core import names
from prfaas_core.capacity.kv import kv_model_from_profile
from prfaas_core.capacity.profiles import builtin_model_profiles

KV = kv_model_from_profile(builtin_model_profiles()["internal-1t"])
GATEWAY_GBPS = 0.1
CAP_GBPS = GATEWAY_GBPS * 0.8
TOKENS = 40_000
LINK = {"link": "a-to-b"}


def prompt(tokens: int) -> str:
    head = uuid.uuid4().hex
    return head + "x" * (tokens * 4 - len(head))


def routes(routers: list[str]) -> dict[str, list[str]]:
    """Each router's answers, decisions, fallbacks and link waits (what a failed assertion shows)."""
    wanted = (
        names.METRIC_ROUTER_REQUESTS,
        names.METRIC_ROUTER_ROUTE_DECISIONS,
        names.METRIC_ROUTER_FALLBACKS,
        names.METRIC_ROUTER_LINK_WAITS,
    )
    return {
        r: [line for line in httpx.get(r + "/metrics", timeout=5).text.splitlines() if line.startswith(wanted)]
        for r in routers
    }


@pytest.mark.parametrize("replicas", [1, 2])
def test_three_routers_one_gateway_calendar_hold_the_cap(tmp_path: Path, replicas: int) -> None:
    with processes(tmp_path) as procs:
        admission = {"capacityGbps": GATEWAY_GBPS, "pullGbps": GATEWAY_GBPS}
        ports = {k: free_port() for k in (2, 3)}
        others = [f"http://127.0.0.1:{port}" for port in ports.values()]
        (tmp_path / "peers-token").write_text("books-s3cret\n")
        token = ["--peers-token-file", str(tmp_path / "peers-token")]  # peers need it
        st = start_stack(
            procs,
            tmp_path,
            gateway_admission=admission,
            gateway_replicas=replicas,
            router_args=["--peers", ",".join(others), *token],
        )
        gateways = [st.url("gateway"), *([st.url("gateway-2")] if replicas == 2 else [])]
        routers = [st.router, *others]
        for k, port in ports.items():
            config = json.loads(json.dumps(st.configs["router"]))
            target = gateways[-1] if k == 3 else gateways[0]
            config["remotes"][0].update(url=target, statusUrl=target + "/status")
            (tmp_path / f"router-{k}.json").write_text(json.dumps(config))
            peers = ",".join(r for r in routers if r != f"http://127.0.0.1:{port}")
            config_file = str(tmp_path / f"router-{k}.json")
            procs.start(
                f"router-{k}",
                [*PRFAAS, "router", "--config", config_file, "--port", str(port), "--peers", peers, *token],
            )

        def all_ready() -> bool:
            procs.check_alive()
            for url in routers:
                status, body = http("GET", url + "/ready", timeout_s=2)
                if status != 200 or set((body.get("remotes") or {"-": "?"}).values()) != {"ready"}:
                    return False
                if set((body.get("link_calendar") or {"-": False}).values()) != {True}:
                    return False  # it has read scheduledLinks: the gateway's calendar, not its own ledger, decides
            return True

        wait_for(all_ready, 60, "three routers ready, each seeing its gateway and that it schedules the link")
        link = st.url("link_admin")
        statuses: list[int] = []
        stop = threading.Event()

        def client(router: str) -> None:
            while not stop.is_set():
                body = {"model": "m", "prompt": prompt(TOKENS), "max_tokens": 2}
                statuses.append(http("POST", router + "/v1/completions", body, timeout_s=60)[0])

        threads = [threading.Thread(target=client, args=(r,), daemon=True) for r in routers for _ in range(3)]
        windows: list[float] = []
        last = (time.monotonic(), counter(link, names.METRIC_LINK_EGRESS_BYTES, **LINK))
        for t in threads:
            t.start()
        try:

            def burst_done() -> bool:
                nonlocal last
                now = time.monotonic()
                if now - last[0] >= 1.0:
                    sent = counter(link, names.METRIC_LINK_EGRESS_BYTES, **LINK)
                    windows.append((sent - last[1]) * 8 / 1e9 / ((now - last[0]) * TIME_SCALE))
                    last = (now, sent)
                return len(windows) >= 5

            wait_for(burst_done, 60, "five 1-s egress windows of the burst", 0.05)
        finally:
            stop.set()
            for t in threads:
                t.join(90)
        pull_gbit = KV.kv_bytes(TOKENS) * 8 / 1e9
        allowed = CAP_GBPS + pull_gbit / TIME_SCALE  # one pull may land at wire speed
        booked = sum(
            counter(g, names.METRIC_GATEWAY_ADMISSIONS, GATEWAY_AUTH, **LINK, result="booked") for g in gateways
        )
        declined = sum(
            counter(g, names.METRIC_GATEWAY_ADMISSIONS, GATEWAY_AUTH, **LINK, result="link_window") for g in gateways
        )
        remote = sum(counter(r, "prfaas_router_requests_total", route="remote", outcome="ok") for r in routers)
        print(
            f"replicas={replicas}: {len(statuses)} answered, {remote:.0f} remote, gateway booked {booked:.0f} / "
            f"declined {declined:.0f}; egress windows {[round(w, 3) for w in windows]} Gbps (cap {CAP_GBPS}, "
            f"allowed {allowed:.3f})"
        )
        assert statuses and all(s == 200 for s in statuses), statuses
        assert booked >= 1 and remote >= 1, routes(routers)  # the link was used
        assert max(windows) <= allowed, (windows, allowed)
        # each router sent the other two its books and hears both (a heartbeat lost to the burst's CPU load may
        # have let a peer expire for a moment: the next ones bring it back)
        assert all(counter(r, names.METRIC_ROUTER_REPLICA_SYNC, result="sent") >= 1 for r in routers)
        wait_for(
            lambda: all(counter(r, names.METRIC_ROUTER_REPLICA_PEERS) == 2 for r in routers),
            30,
            "every router to hear the other two",
        )

        def pulls(end: str) -> float:
            return sum(counter(g, names.METRIC_GATEWAY_PULLS, GATEWAY_AUTH, **LINK, end=end) for g in gateways)

        # every remote request's router told the gateway when its pull was over (none waited out a lease)
        ends = wait_for(
            lambda: (e := {end: pulls(end) for end in ("reported", "lease")})["reported"] + e["lease"] >= remote and e,
            60,
            f"{remote:.0f} pulls over, reported or by their leases",
        )
        reports = [
            f"router-{k}: {line}"
            for k, name in enumerate(("router", "router-2", "router-3"), 1)
            for line in procs.log(name).splitlines()
            if "report" in line and "pull" in line
        ]
        assert ends["lease"] == 0 and ends["reported"] >= remote, (ends, remote, reports)
        if replicas == 2:  # the replicas lent each other their share over HTTP, and gave every loan back
            loans = {
                r: sum(counter(g, names.METRIC_GATEWAY_LOANS, GATEWAY_AUTH, **LINK, result=r) for g in gateways)
                for r in ("borrowed", "lent", "expired", "unreachable")
            }
            print(f"loans {loans}")
            assert loans["borrowed"] >= 1 and loans["lent"] >= loans["borrowed"], loans
            # a loan comes back by its lease only when its answer or its give-back was lost on the way
            assert loans["expired"] <= loans["unreachable"], loans
            # a pull report that reaches the other replica (one Service in front of both) is forwarded to the
            # replica that let the pull on, once
            leg = {
                "model": "m",
                "prompt": prompt(TOKENS),
                "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
            }
            first = httpx.post(gateways[0] + "/v1/completions", json=leg, headers=GATEWAY_AUTH, timeout=60)
            assert first.status_code == 200, first.text
            done = names.PULL_DONE_PATH.format(pull_id=first.headers[names.HEADER_PULL_ID])
            forwarded = httpx.post(gateways[1] + done, headers=GATEWAY_AUTH, timeout=10)
            assert forwarded.status_code == 200, forwarded.text
            assert httpx.post(gateways[1] + done, headers=GATEWAY_AUTH, timeout=10).status_code == 404
