"""The sidecar router (and, in gateway mode, the prefill gateway): the data plane of PrFaaS.

Per request it estimates the uncached length, calls the core's short-term policy, and runs vLLM's
disaggregated-serving exchange (NixlConnector/MooncakeConnector as exposed to proxies, as vllm-router 0.1.17
drives it; the bodies and the KV handle are the engine kind's, :mod:`prfaas_core.launch.vllm`): a prefill leg
with ``max_tokens: 1`` asking for a KV handle — to a local prefill instance or, through the remote gateway, to a
PrFaaS instance — then a decode leg carrying the handle the prefill returned, whose stream goes back to the
client. Signals (engine metrics,
link egress, gateway status, health) are refreshed off the hot path into an immutable snapshot. Imports the
core, never the operator or the engine emulator.
"""
