"""The router's subscription to an engine's KV events over a real ZMQ socket (a PUB socket speaking vLLM 0.32's
protocol: ``(topic, 8-byte big-endian seq, msgpack [ts, events, dp_rank])``), and the engine seam's flag."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
import zmq
from prometheus_client import generate_latest

from prfaas_cli.engines_cmd import _ports
from prfaas_core import names
from prfaas_core.api import ModelProfile, PDCluster, RouterConfig
from prfaas_core.capacity.profiles import builtin_model_profiles
from prfaas_core.launch.engines import EngineSpec
from prfaas_core.launch.kinds import engine_launch
from prfaas_core.launch.render import engine_specs
from prfaas_core.launch.vllm import KV_EVENTS_FLAG, KV_EVENTS_TOPIC, kv_events_url
from prfaas_core.request.tokens import block_hashes
from prfaas_operator.router_config import pod_endpoints
from prfaas_router.state.config import compile_config
from prfaas_router.state.metrics import RouterMetrics, sample_sum
from prfaas_router.state.runtime import Runtime
from prfaas_router.state.signals import KvEventFeed

B = 16
EX04 = Path(__file__).parents[2] / "examples" / "04-real-engines"
PROMPT = list(range(1, 4 * B + 3))


def runtime(url: str) -> Runtime:
    doc: dict[str, Any] = {
        "pdCluster": "pd",
        "thresholdMinTokens": 20_000,
        "model": builtin_model_profiles()["internal-1t"],
        "routing": {"prefixBlockTokens": B},
        "endpoints": [
            {"name": "pd-0", "url": "http://pd-0", "role": "prefill", "kvEventsUrl": url},
            {"name": "pd-1", "url": "http://pd-1", "role": "prefill"},
            {"name": "pd-2", "url": "http://pd-2", "role": "decode"},
        ],
    }
    return Runtime(compile_config(RouterConfig.model_validate(doc)))


def stored(ids: list[int]) -> dict[str, Any]:
    n = len(ids) // B
    return {
        "type": "BlockStored",
        "block_hashes": [1000 + i for i in range(n)],  # vLLM's hashes (ints under VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)
        "parent_block_hash": None,
        "token_ids": ids[: n * B],
        "block_size": B,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "group_idx": 0,
    }


def frames(seq: int, *events: dict[str, Any]) -> list[bytes]:
    return [KV_EVENTS_TOPIC.encode(), seq.to_bytes(8, "big"), msgspec.msgpack.encode([time.time(), list(events), None])]


def exported(metrics: RouterMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def batches(metrics: RouterMetrics, outcome: str) -> float:
    got = sample_sum(exported(metrics), names.METRIC_ROUTER_KV_EVENT_BATCHES, {"engine": "pd-0", "outcome": outcome})
    return got or 0.0


async def until(cond: Any, pub: zmq.Socket | None = None, then: list[bytes] | None = None) -> None:
    deadline = time.monotonic() + 30  # generous: a loaded CI machine, not the feed, sets the pace
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        if pub is not None and then is not None:
            pub.send_multipart(then)  # a PUB socket drops what it sends before the subscriber joined
        await asyncio.sleep(0.02)


def test_the_router_keeps_its_index_of_an_engine_from_its_events() -> None:
    async def main() -> None:
        ctx = zmq.Context()
        pub = ctx.socket(zmq.PUB)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        rt = runtime(f"tcp://127.0.0.1:{port}")
        metrics = RouterMetrics()
        feed = KvEventFeed(rt, metrics)
        hashes = block_hashes(PROMPT, B)
        rt.pd_index.insert(hashes, "pd-0")  # what the learned index believes (routed there)
        rt.pd_index.insert(hashes, "pd-1")
        try:
            feed.sync()
            seq = 0
            # the first batch: from now on pd-0 is matched from its events (it holds 2 blocks, not what was routed)
            await until(lambda: rt.pd_index.live("pd-0"), pub, frames(seq, stored(PROMPT[: 2 * B])))
            await until(lambda: rt.pd_index.match(hashes).get("pd-0") == 2 * B)
            assert rt.pd_index.match(hashes)["pd-1"] == 4 * B  # no events: learned
            seq += 5  # batches lost: the holdings are cleared, the resync counted
            pub.send_multipart(frames(seq))
            await until(lambda: batches(metrics, "resync") == 1)
            assert "pd-0" not in rt.pd_index.match(hashes)
            pub.send_multipart([b"kv-events", b"short"])  # not the protocol: counted, skipped
            await until(lambda: batches(metrics, "malformed") == 1)
            feed.sync()
            assert sample_sum(exported(metrics), names.METRIC_ROUTER_KV_INDEX_BLOCKS, {"engine": "pd-0"}) == 0
        finally:
            await feed.close()
            pub.close(linger=0)
            ctx.term()
        assert not rt.pd_index.live("pd-0")  # the subscription ended: learned again
        assert rt.pd_index.match(hashes)["pd-0"] == 4 * B

    asyncio.run(main())


def test_the_engine_seam_renders_the_events_flag_and_its_address() -> None:
    spec = EngineSpec(role="pd-prefill", model="m", served_model_name="m", port=8000, kv_events_port=5557)
    argv = engine_launch(spec).argv
    config = json.loads(argv[argv.index(KV_EVENTS_FLAG) + 1])
    assert config == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
        "topic": KV_EVENTS_TOPIC,
    }
    assert kv_events_url(spec, "10.0.0.7") == "tcp://10.0.0.7:5557"
    assert KV_EVENTS_FLAG not in engine_launch(EngineSpec(role="pd-prefill", model="m", served_model_name="m")).argv
    with pytest.raises(ValueError, match="kv_events_port"):
        engine_launch(EngineSpec(role="pd-prefill", model="m", served_model_name="m", port=8000, kv_events_port=8000))


def test_a_cluster_with_kv_events_port_renders_the_flag_the_port_and_the_routers_endpoint() -> None:
    """From the resource to the router: ``spec.engine.kvEventsPort`` -> the engines' flag and their container port
    (the chart's engine values) -> the operator's ``kvEventsUrl`` of each pod."""
    body = yaml.safe_load((EX04 / "region-b" / "pd-cluster.yaml").read_text())
    body["spec"].setdefault("engine", {})["kvEventsPort"] = 5557
    cluster = PDCluster.model_validate(body)
    profile = ModelProfile.model_validate(yaml.safe_load((EX04 / "common" / "model-profile.yaml").read_text()))
    for spec in engine_specs(cluster, profile).values():
        assert spec.kv_events_port == 5557
        assert KV_EVENTS_FLAG in engine_launch(spec).argv
        assert _ports(spec)["kvEvents"] == 5557
    pod = {
        "metadata": {"name": "pd-0", "labels": {"prfaas.io/role": "prefill"}},
        "status": {"podIP": "10.1.2.3"},
        "spec": {
            "containers": [
                {"ports": [{"name": "http", "containerPort": 8000}, {"name": "kv-events", "containerPort": 5557}]}
            ]
        },
    }
    endpoints, _ = pod_endpoints([pod])
    assert endpoints[0].kv_events_url == "tcp://10.1.2.3:5557"
    bare = {**pod, "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 8000}]}]}}
    assert pod_endpoints([bare])[0][0].kv_events_url is None
    body["spec"]["engine"]["kvEventsPort"] = body["spec"]["engine"].get("port", 8000)
    with pytest.raises(ValueError, match="kvEventsPort"):
        PDCluster.model_validate(body)
