"""The PrFaaS Kubernetes operator: the long-term half of PrFaaS scheduling as a well-behaved controller.

It watches PDClusters, PrefillClusters, InterDCLinks and ModelProfiles (kopf), keeps one batched cycle that
observes every PD cluster through Prometheus, runs the core's long-term loop (``prfaas_core.policy``) for
each, actuates role flips (relabel or scale, always after a drain), publishes each PD cluster's router
configuration as a ConfigMap, and reports status, events, metrics and JSON logs. Only the Lease holder acts.

The long-term decisions are the core's (:func:`prfaas_core.policy.long_term.step`); the operator gathers the
tick, carries out the effects and reports them (docs/ARCHITECTURE.md, "The long-term path").

Module map: :mod:`.handlers` (kopf registrations only), :mod:`.runner` (wiring: builds the operator),
:mod:`.embedded` / :mod:`.kopf_entry` (run kopf with the handlers), :mod:`.cycle` (the batched periodic
cycle), :mod:`.pd_cluster` (the PD reconcile: gather, decide, carry out, report), :mod:`.pods` (pods read:
roles, readiness, the observation, the persisted loop state), :mod:`.pd_refs` (references, link index),
:mod:`.pd_status` (status composed from the decision), :mod:`.prefill_cluster`, :mod:`.link`,
:mod:`.model_profile` (reconcile code), :mod:`.observe` (Prometheus), :mod:`.actuate` (Kubernetes
actuator), :mod:`.router_config`, :mod:`.status` (conditions, Events, typed status), :mod:`.leader`,
:mod:`.metrics`, :mod:`.kube` (the API client).
"""
