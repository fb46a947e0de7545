"""The PrFaaS Kubernetes operator: the long-term half of PrFaaS scheduling as a well-behaved controller.

It watches PDClusters, PrefillClusters, InterDCLinks and ModelProfiles (kopf), keeps one batched cycle that
observes every PD cluster through Prometheus, runs the core's long-term loop (``prfaas_core.policy``) for
each, actuates role flips (relabel or scale, always after a drain), publishes each PD cluster's router
configuration as a ConfigMap, and reports status, events, metrics and JSON logs. Only the Lease holder acts.

Module map: :mod:`.handlers` (kopf registrations only), :mod:`.cycle` (the batched periodic cycle),
:mod:`.pd_cluster`, :mod:`.prefill_cluster`, :mod:`.link`, :mod:`.model_profile` (reconcile code),
:mod:`.observe` (Prometheus), :mod:`.actuate` (Kubernetes actuator), :mod:`.router_config`,
:mod:`.status`, :mod:`.leader`, :mod:`.metrics`, :mod:`.kube` (the API client), :mod:`.runner` (wiring).
"""
