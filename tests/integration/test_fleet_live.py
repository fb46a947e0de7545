"""A live fleet (prfaas_local.fleet, what ``prfaas up --fleet`` runs): 2 sites, 2 regions, 4 links, emulated engines.
Both regions prefer site-1 (its link first, equal predicted TTFT), so site-1's gateway serves both regions' links
under its egress cap. Cutting east's link to site-1 moves east's remote prefills to site-2 (the delay, in model
seconds, is printed), no request is lost (a call cut mid-way falls back to the local prefill), and each site's
egress, by its relays' own 1-s counters, stays under the site cap in every settled window (plus the shaper's burst).
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import httpx
from testbed_support import wait_for

from prfaas_local.fleet import FleetSpec, FleetStack, link_name, settled

TOKENS = 20_000


def _load(url: str, stop: threading.Event, statuses: list[int]) -> None:
    with httpx.Client(timeout=60.0) as client:
        while not stop.is_set():
            body = {"model": "m", "prompt": uuid.uuid4().hex + "x" * (TOKENS * 4 - 32), "max_tokens": 4}
            try:
                statuses.append(client.post(url + "/v1/completions", json=body).status_code)
            except httpx.HTTPError as exc:  # a lost request: counted, never retried
                statuses.append(-1)
                print("lost:", exc)


def test_a_cut_link_moves_its_region_to_the_other_site_under_the_site_cap(tmp_path: Path) -> None:
    spec = FleetSpec()
    fleet = FleetStack(spec, tmp_path)
    stop = threading.Event()
    statuses: list[int] = []
    threads: list[threading.Thread] = []
    try:
        fleet.start()
        assert all(fleet.remotes_ready(r) for r in spec.regions), "the routers see every site ready"
        for region in spec.regions:  # two clients per region, one request after another each
            url = fleet.regions[region].url("router")
            threads += [threading.Thread(target=_load, args=(url, stop, statuses), daemon=True) for _ in range(2)]
        for t in threads:
            t.start()
        east_1, east_2, west_1 = link_name("east", "site-1"), link_name("east", "site-2"), link_name("west", "site-1")
        wait_for(
            lambda: fleet.gateway_bytes("site-1").get(east_1, 0) > 0 and fleet.gateway_bytes("site-1").get(west_1, 0),
            60,
            "site-1 serving both regions",
        )
        before = fleet.gateway_bytes("site-2").get(east_2, 0.0)
        cut_at = fleet.cut(east_1)
        wait_for(lambda: fleet.gateway_bytes("site-2").get(east_2, 0.0) > before, 60, "east's prefills at site-2")
        moved_s = (time.monotonic() - cut_at) * spec.time_scale
        print(f"cut {east_1}: east's remote prefills at site-2 after {moved_s:.1f} model seconds")
        # nothing reaches site-1 over the cut link any more; west keeps using site-1
        stalled = fleet.gateway_bytes("site-1").get(east_1, 0.0)
        west_then, east_then = fleet.gateway_bytes("site-1").get(west_1, 0.0), fleet.gateway_bytes("site-2")[east_2]
        wait_for(
            lambda: (
                fleet.gateway_bytes("site-1").get(west_1, 0.0) > west_then
                and fleet.gateway_bytes("site-2")[east_2] > east_then
            ),
            60,
            "more remote prefills of both regions after the cut",
        )
        assert fleet.gateway_bytes("site-1").get(east_1, 0.0) == stalled
        stop.set()
        for t in threads:
            t.join(60)
        assert statuses and all(s == 200 for s in statuses), statuses
        burst = fleet.burst_gbit()
        for site in spec.sites:
            windows = settled(fleet.site_windows(site))
            assert windows, site
            assert max(windows.values()) <= spec.site_cap_gbps + burst + 1e-9, (site, windows)
            busiest = max(windows.values())
            print(f"{site}: {len(windows)} windows, the busiest {busiest:.2f} Gbps (cap {spec.site_cap_gbps})")
    finally:
        stop.set()
        fleet.stop()
