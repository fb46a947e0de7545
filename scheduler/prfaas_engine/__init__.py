"""A vLLM-compatible engine emulator for GPU-free tests and the local stack (``prfaas engine``).

It serves the OpenAI API the way vLLM does (completions and chat, SSE streaming with
``stream_options.include_usage``, ``/v1/models``, ``/health``, and ``/v1/completions/render`` /
``/v1/chat/completions/render``, which vllm-router 0.1.17 calls before every request), exports vLLM's metric
names and types on ``/metrics`` (labels ``model_name`` and ``engine``), and speaks both disaggregation
protocols that the peer routers use (:mod:`.disagg`): vLLM's NixlConnector/MooncakeConnector
``kv_transfer_params`` (prefill leg ``do_remote_decode`` → response ``{do_remote_prefill, do_remote_decode,
remote_engine_id, remote_block_ids, remote_host, remote_port, tp_size}`` → decode leg), as vllm-router 0.1.17
sends it with ``--vllm-pd-disaggregation --kv-connector nixl``, and SGLang's ``bootstrap_host``/``_port``/
``_room``, both legs at once, as sglang-router 0.3.2 sends it with ``--pd-disaggregation``.

Behaviour is modelled, not computed: token counts from a pluggable tokenizer (:mod:`.tokenizer`, ~4 chars per
token by default); prefill and decode times from the core's hardware profile (:mod:`.timing`) scaled by one
:class:`~prfaas_core.launch.emulation.ScaleSettings`; continuous batching with a waiting queue (:mod:`.batching`); a
prefix cache of hashed blocks (:mod:`.prefix_cache`); KV really crosses TCP, ``S_kv(l)·byte_scale`` bytes pulled
by the decode engine from the address the prefill engine *advertises* (:mod:`.kv_transfer`), so the bytes can
go through the link emulator. Runtime control: drain, role flips and fault knobs under ``/admin``
(:mod:`.routes`, :mod:`.faults`).

Versions matched: the request/response fields of vLLM's NixlConnector ``kv_transfer_params`` (vLLM 0.11
line) exactly as vllm-router 0.1.17 forwards them, and sglang-router 0.3.2's bootstrap fields; both routers run
against the emulator in the integration tests.

Gaps versus a real vLLM: vllm-router's ``--kv-connector mooncake`` mode first queries a Mooncake bootstrap
HTTP server (``GET /query`` on the prefill's bootstrap port, 8998 by default), which the emulator does not
serve (use ``--kv-connector nixl``); no model (outputs are filler words, always ``finish_reason: "length"``,
no logprobs, no stop sequences, tools or structured output); one prompt and one choice per request; the KV
model transfers the whole prompt's ``S_kv`` (a decode-side prefix hit does not shrink the pull); KV moves
over our own one-connection-per-pull TCP protocol, not NIXL/Mooncake RDMA; no ``/tokenize``, LoRA,
embeddings or ``/v1/responses``; metrics cover the series the control plane reads (not vLLM's full set).
"""

from .config import EngineConfig, HostPort
from .routes import ENGINE_KEY, create_app

__all__ = ["ENGINE_KEY", "EngineConfig", "HostPort", "create_app"]
