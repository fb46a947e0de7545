"""The local two-region stack: emulated or real engines, on the loopback or in network namespaces, the link
relays, the prefill gateway and the routers, built by one builder (:mod:`.stack`) that ``prfaas up``, ``prfaas up
--engines vllm``, the benchmarks and the tests share; and what runs on it: the core's long-term loop with a
local observer and actuator (:mod:`.local_loop`), the load (:mod:`.load`), the report and the pictures.

Above the shells (router, engine emulator, link emulator) and the core; below the CLI, which keeps its commands
only, and the operator testbed."""
