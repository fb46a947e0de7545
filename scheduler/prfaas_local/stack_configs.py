"""What the local stack is made of (:class:`StackSpec`) and what the engine kind changes in its router and
gateway configs (the model, its tokenizer, the clock and hardware of emulated engines, the block size and timeouts
of real vLLM engines on CPU); the rest of each config is the builder's (:mod:`.stack`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from prfaas_core.api import SloSpec
from prfaas_core.capacity.profiles import builtin_model_profiles

LINK = "a-to-b"
"""The one link between the regions (its relays, the routers' ``links``)."""

VLLM_TOKEN = "real-tier-token"
"""The gateway's token over real engines (a fixed one: the real tier's tests send it)."""

BLOCK_SIZE = 128
"""The real engines' KV block (``--block-size``), the routers' ``prefixBlockTokens``."""


def emulated_fields(model_profile: str, time_scale: float, byte_scale: float) -> dict[str, Any]:
    """Emulated engines: a built-in model profile, the model clock, H200 PrFaaS and H20 PD hardware."""
    model = builtin_model_profiles()[model_profile].model_dump(mode="json", by_alias=True, exclude_none=True)
    prfaas = {"accelerator": "H200"}
    return {
        "common": {"model": model, "scale": {"timeScale": time_scale, "byteScale": byte_scale}},
        "gateway": {"prfaasHardware": prfaas},
        "router": {"pdHardware": {"accelerator": "H20"}, "prfaasHardware": prfaas},
        "links": None,
    }


def tiny_model_profile(env: Any) -> dict[str, Any]:
    """The tiny model's ModelProfile spec: 2 full-attention layers, 2 KV heads of dim 32, bf16 (512 B/token); or
    the environment's own (the tiny hybrid's, measured by ``prfaas profile``)."""
    if getattr(env, "model_profile", None):
        return dict(env.model_profile)
    return {
        "servedModelName": env.served_model_name,
        "architecture": {"fullAttentionLayers": 2, "kvHeads": 2, "headDim": 32, "kvDtype": "bf16"},
        "tokenizer": {"file": env.tokenizer_file},
    }


def vllm_fields(env: Any) -> dict[str, Any]:
    """Real vLLM engines (``env``: their :class:`~.vllm_engines.RealEnv`): the model's own tokenizer, the engines'
    KV block size as ``prefixBlockTokens`` (the block the engine really uses: a hybrid's profile names it)."""
    model = tiny_model_profile(env)
    block = (model.get("architecture") or {}).get("blockTokens") or BLOCK_SIZE
    return {
        "common": {"model": model, "tokenizerFile": env.tokenizer_file},
        "gateway": {"routing": {"prefixBlockTokens": block, "refreshIntervalSeconds": 0.5}},
        "router": {
            "routing": {"prefixBlockTokens": block, "breakerOpenSeconds": 3},
            # a KV pull on CPU vLLM occasionally stalls for many seconds on a loaded 2-core machine (the decode
            # engine busy-steps while it waits): only a dead producer (vLLM answers 500 within ~5 s) falls back
            "timeouts": {"kvPullSeconds": 120},
        },
        # engines on one host: the "link" is the loopback, whose capacity is not in doubt. A KV pull a loaded CPU
        # decode engine is slow to start would otherwise read as a squeezed link and keep long prompts local for
        # ~20 s (the netns tier, a shaped veth, measures its link: it sets its own links)
        "links": [{"name": LINK, "capacityGbps": 100, "availableBandwidth": "Configured"}],
    }


@dataclass(frozen=True)
class StackSpec:
    """What the stack is made of: its engines, the link between the regions, the clock, the routers' configs."""

    n_prfaas: int = 2
    n_pd: int = 4
    """PD engines: the first ``initial_prefill`` prefill, the rest decode."""
    initial_prefill: int = 1
    link_gbps: float = 100.0
    """The link's capacity (model Gbps), split evenly over the relays (one per PrFaaS engine)."""
    link_max_utilization: float = 0.8
    rtt_ms: float = 5.0
    """The relays' round trip."""
    time_scale: float = 4.0
    byte_scale: float = 1e-3
    """Model bytes per wire byte (the emulators' and relays' scale, as ``time_scale`` is their clock's)."""
    threshold_min_tokens: int = 19_634
    model_profile: str = "internal-1t"
    """A built-in model profile (the emulated engines' model)."""
    served_models: tuple[str, ...] = ()
    """The model names the router accepts (others get OpenAI's 404); empty: any."""
    gateway_admission: bool = False
    """The gateway schedules the link (``gateway.admission``; pull-after-prefill, one pull at a relay's rate)."""
    admission: dict[str, Any] | None = None
    """The gateway's admission block as given (with ``gateway_admission``; None: pulls at a relay's rate)."""
    kv_lease_s: float = 480.0
    """How long the emulated engines hold a prefill's KV for a pull that has not started (``prfaas engine
    --kv-timeout``); their gateway's admission assumes the same (``kvLeaseSeconds``; real vLLM: its default, 30 s)."""
    gateway_link_gbps: float | None = None
    """The link's configured capacity, the gateway's and the routers' alike (their views agree, as the operator
    writes both from one InterDCLink; None: ``link_gbps``); the emulated wire keeps ``link_gbps``."""
    site_egress_cap_gbps: float | None = None
    """The gateway's site egress cap (``gateway.siteEgressCapGbps``; None: none, the link alone)."""
    router_link_gbps: float | None = None
    """A routers' view of the link that differs from the gateway's on purpose: they configure this capacity and
    send it with each remote prefill, and the gateway refuses those prefills (400 naming ``capacityGbps``). None:
    the views agree (``gateway_link_gbps``)."""
    egress_pacing: bool = False
    """Each PrFaaS instance's egress paced to cap / instances (what ``linkScheduling.egressPacing: PerInstance``
    asks of the CNI in a cluster): its relay runs at that rate, and the gateway books each pull at it."""
    slo: SloSpec | None = field(default_factory=SloSpec)
    """The SLO the router routes by (spills, link waits): what the operator passes from a PDCluster's
    ``spec.slo``, its defaults here; None: a router with no SLO configured."""
    prfaas_cluster: str = "prfaas-h200"
    """The PrefillCluster the gateway fronts (the router's remote, the engines' ``prefill_cluster`` label)."""
    pd_cluster: str = "pd-h20"
    gateway_token: str | None = None
    """The gateway's bearer token (None: a random one)."""
    gateway_replicas: int = 1
    """> 1: that many gateways (``gateway``, ``gateway-2``, ...), each naming all as admission peers."""
    gateway_tls: tuple[Path, Path] | None = None
    """(certificate, key) the gateways serve; the router and the replicas verify it as their CA."""
    routing: dict[str, Any] = field(default_factory=lambda: {"refreshIntervalSeconds": 0.5})
    """The router's ``routing`` block."""
    remote_timeout_s: float | None = None
    """The router's remote's ``timeoutSeconds`` (None: the default)."""
    gateway_extra: dict[str, Any] = field(default_factory=dict)
    """More top-level fields of the gateway's config."""
    router_extra: dict[str, Any] = field(default_factory=dict)
    """More top-level fields of the router's config (last: they replace the builder's)."""
    router_args: tuple[str, ...] = ()
    """More command-line arguments of the router (``--peers``)."""
    router_cmd: tuple[str, ...] = ()
    """How the router and the gateways are run (empty: this interpreter's ``prfaas``; ``prfaas`` from an image:
    tests/integration/test_image.py)."""


VLLM_SPEC = StackSpec(
    n_prfaas=1,
    n_pd=2,
    slo=None,
    prfaas_cluster="prfaas",
    pd_cluster="pd",
    gateway_token=VLLM_TOKEN,
    remote_timeout_s=10,
)
"""The routers over real vLLM engines (the real-engine tier, ``prfaas up --engines vllm``)."""


class Endpoint(Protocol):
    """What a router configuration needs of an engine: its name and base URL."""

    @property
    def name(self) -> str: ...

    @property
    def url(self) -> str: ...


def kv_events_field(engine: Endpoint) -> dict[str, str]:
    """An endpoint's ``kvEventsUrl`` when its engine publishes KV events (a real engine started with them)."""
    url = getattr(engine, "kv_events_url", None)
    return {"kvEventsUrl": url} if url else {}


class EngineRef(NamedTuple):
    """An engine somebody else started (or :meth:`LocalStack.start` did): its name and base URL."""

    name: str
    url: str
