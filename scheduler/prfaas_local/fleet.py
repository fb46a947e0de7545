"""A fleet on one machine (``prfaas up --fleet``): PrFaaS sites serving PD regions, each made of the local stack's
own parts (:class:`~.stack.LocalStack`; no second implementation of the stack).

* **A site**: its PrFaaS engines, each behind its link relay (the relays together are the site's NICs: their own
  1-s counters measure the site's egress, every link's KV together), and one gateway serving every link to the
  site (``links[]``, one per region) under the site's egress cap (``gateway.siteEgressCapGbps``).
* **A region**: its PD engines and one router with one remote per link (each site's gateway, reached through a
  *control relay* per link: cutting the link stops it, so the router's calls over that link fail as over a cut
  WAN; the KV already on its way finishes).
* **Drain**: a drained site's gateway lists every engine in its drain list (what the operator writes for
  ``spec.drained``): it starts nothing new, what it holds finishes.

The routers and the gateways see every link alike (their views agree: the routers send theirs, the gateways
compare). Times are model seconds (the engines', relays' and routers' ``time_scale``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from prfaas_core import names
from prfaas_link.config import shaper_burst_gbit

from .ports import free_port
from .procs import Processes
from .stack import PRFAAS, LocalStack
from .stack_configs import StackSpec


def link_name(region: str, site: str) -> str:
    return f"{region}-to-{site}"


@dataclass(frozen=True)
class FleetSpec:
    """2 sites and 2 regions by default, every region reaching every site (4 links)."""

    sites: tuple[str, ...] = ("site-1", "site-2")
    regions: tuple[str, ...] = ("east", "west")
    n_prfaas: int = 2
    """PrFaaS engines per site."""
    n_pd: int = 2
    """PD engines per region (one prefill, the rest decode)."""
    link_gbps: float = 10.0
    """Each link's capacity (model Gbps; its cap ``x link_max_utilization``)."""
    link_max_utilization: float = 0.8
    site_cap_gbps: float = 2.5
    """Each site's egress cap, shared by its links (model Gbps): one 2-Gbps pull at a time."""
    site_nic_gbps: float = 4.0
    """The site's relays together (the wire; 2 Gbps each, what one pull runs at): above the site cap, so that the
    gateway is what holds it (without the cap two pulls overlap: 4.19 Gbps in a 1-s window, measured)."""
    time_scale: float = 50.0
    byte_scale: float = 1e-3
    threshold_min_tokens: int = 8_000
    token: str = "fleet-token"
    remote_timeout_s: float = 10.0
    base: StackSpec = field(default_factory=StackSpec)
    """The rest of each part's stack spec (model profile, SLO, routing)."""

    def links(self) -> list[tuple[str, str, str]]:
        """(link, region, site) of every link."""
        return [(link_name(r, s), r, s) for r in self.regions for s in self.sites]


class FleetStack:
    """The fleet's processes: one :class:`LocalStack` per site and per region, a control relay per link."""

    def __init__(self, spec: FleetSpec, work_dir: Path) -> None:
        self.spec, self.work_dir = spec, work_dir
        self.procs = Processes(work_dir / "logs")
        common = replace(
            spec.base,
            time_scale=spec.time_scale,
            byte_scale=spec.byte_scale,
            link_max_utilization=spec.link_max_utilization,
            gateway_token=spec.token,
            remote_timeout_s=spec.remote_timeout_s,
            threshold_min_tokens=spec.threshold_min_tokens,
        )
        self.sites = {
            s: LocalStack(
                replace(
                    common,
                    n_prfaas=spec.n_prfaas,
                    n_pd=0,
                    link_gbps=spec.site_nic_gbps,
                    gateway_admission=True,
                    gateway_link_gbps=spec.link_gbps,
                    prfaas_cluster=s,
                ),
                work_dir / s,
                procs=Processes(work_dir / "logs" / s),
            )
            for s in spec.sites
        }
        self.regions = {
            r: LocalStack(
                replace(common, n_prfaas=0, n_pd=spec.n_pd, link_gbps=spec.link_gbps, pd_cluster=r),
                work_dir / r,
                procs=Processes(work_dir / "logs" / r),
            )
            for r in spec.regions
        }
        self.control: dict[str, str] = {}
        """Each link's control relay (admin URL)."""
        self.drained: set[str] = set()

    # -- start and stop ----------------------------------------------------------------------------------------

    def start(self) -> None:
        spec = self.spec
        for site, st in self.sites.items():
            engines = [st._start_prfaas(i) for i in range(spec.n_prfaas)]
            config = st.make_gateway_config(engines)
            config["links"] = [self._link(name) for name, _, s in spec.links() if s == site]
            config["gateway"]["siteEgressCapGbps"] = spec.site_cap_gbps
            config["gateway"]["admission"]["link"] = config["links"][0]["name"]
            st.start_router("gateway", config)
        for name, _, site in spec.links():
            self._start_control(name, self.sites[site])
        for region, rs in self.regions.items():
            pd = [rs._start_pd(i) for i in range(spec.n_pd)]
            config = rs.make_router_config(pd[:1], pd[1:], None, spec.threshold_min_tokens)
            config["links"] = [self._link(name) for name, r, _ in spec.links() if r == region]
            config["remotes"] = [self._remote(name, site) for name, r, site in spec.links() if r == region]
            rs.start_router("router", config)
        for st in self.sites.values():
            st.wait_ready("gateway")
        for rs in self.regions.values():
            rs.wait_ready("router")
        deadline = time.monotonic() + 120.0
        while time.monotonic() < deadline and not all(self.remotes_ready(r) for r in self.regions):
            time.sleep(0.2)

    def remotes_ready(self, region: str) -> bool:
        """Whether the region's router sees every remote ready (its status polls of the gateways)."""
        try:
            body = httpx.get(self.regions[region].url("router") + "/ready", timeout=5.0).json()
        except (httpx.HTTPError, ValueError):
            return False
        remotes = body.get("remotes") or {}
        return len(remotes) == len(self.spec.sites) and set(remotes.values()) == {"ready"}

    def stop(self) -> None:
        for st in [*self.regions.values(), *self.sites.values()]:
            st.stop()
        self.procs.stop_all()

    def _link(self, name: str) -> dict[str, Any]:
        s = self.spec
        return {"name": name, "capacityGbps": s.link_gbps, "maxUtilization": s.link_max_utilization}

    def _remote(self, link: str, site: str) -> dict[str, Any]:
        st = self.sites[site]
        url = self.control[link]
        return {
            "name": site,
            "url": url,
            "statusUrl": url + "/status",
            "tokenFile": str(st.token_file),
            "link": link,
            "timeoutSeconds": self.spec.remote_timeout_s,
        }

    def _start_control(self, link: str, site: LocalStack) -> None:
        """The link's control path: a relay in front of the site's gateway (wide: it shapes nothing)."""
        port, admin = free_port(), free_port()
        target = site.url("gateway").removeprefix("http://")
        self.procs.start(
            f"control-{link}",
            [*PRFAAS, "link", "--listen", f"127.0.0.1:{port}", "--target", target, "--capacity-gbps", "100000",
             "--rtt-ms", "1", "--name", f"control-{link}", "--metrics-port", str(admin),
             "--time-scale", str(self.spec.time_scale)],
        )  # fmt: skip
        self.control[link] = f"http://127.0.0.1:{port}"

    # -- what an operator does ---------------------------------------------------------------------------------

    def cut(self, link: str) -> float:
        """Cut ``link`` (its control relay stops: calls over it fail); returns the wall time it was cut."""
        self.procs.stop(f"control-{link}")
        return time.monotonic()

    def drain(self, site: str) -> None:
        """Drain ``site`` (its gateway's drain list: every engine; the operator's ``spec.drained``)."""
        st = self.sites[site]
        config = dict(st.configs["gateway"])
        config["draining"] = [e["name"] for e in config["endpoints"]]
        st.write_config("gateway", config)
        self.drained.add(site)

    def squeeze(self, site: str, cap_gbps: float) -> None:
        """``site``'s egress cap becomes ``cap_gbps`` (its gateway reloads; its calendars are kept)."""
        st = self.sites[site]
        config = dict(st.configs["gateway"])
        config["gateway"] = {**config["gateway"], "siteEgressCapGbps": cap_gbps}
        st.write_config("gateway", config)

    # -- what is measured --------------------------------------------------------------------------------------

    def remote_bytes(self, region: str) -> dict[str, float]:
        """The KV bytes the region's router sent remote, by link (its ``prfaas_router_remote_bytes_total``)."""
        text = httpx.get(self.regions[region].url("router") + "/metrics", timeout=5.0).text
        return _samples(text, names.METRIC_ROUTER_REMOTE_BYTES, "link")

    def gateway_bytes(self, site: str) -> dict[str, float]:
        """The KV bytes the site's gateway served, by link (``prfaas_gateway_kv_egress_bytes_total``)."""
        st = self.sites[site]
        text = httpx.get(st.url("gateway") + "/metrics", headers=st.gateway_headers, timeout=5.0).text
        return _samples(text, names.METRIC_GATEWAY_KV_EGRESS_BYTES, "link")

    def site_windows(self, site: str) -> dict[int, float]:
        """The site's egress in each 1-s model window (model Gbps), from its relays' own counters summed."""
        st = self.sites[site]
        out: dict[int, float] = {}
        for url in st.link_metric_urls:
            body = httpx.get(url.removesuffix("/metrics") + "/admin/egress", params={"since": 0}, timeout=5.0).json()
            for k, nbytes in body["windows"].items():
                out[int(k)] = out.get(int(k), 0.0) + float(nbytes) * 8.0 / 1e9
        return out

    def burst_gbit(self) -> float:
        """What a site's relays may carry above their rates in one window (the shaper's grants)."""
        return shaper_burst_gbit(self.spec.n_prfaas, self.spec.byte_scale)


def _samples(text: str, metric: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(metric + "{"):
            continue
        labels, value = line.rsplit(" ", 1)
        for part in labels[len(metric) + 1 : -1].split(","):
            key, _, val = part.partition("=")
            if key == label:
                out[val.strip('"')] = out.get(val.strip('"'), 0.0) + float(value)
    return out


def settled(windows: dict[int, float], since: int | None = None) -> dict[int, float]:
    """The windows that are over (the last one still fills), from model second ``since`` on."""
    if not windows:
        return {}
    last = max(windows)
    return {k: v for k, v in windows.items() if k < last and (since is None or k >= since)}
