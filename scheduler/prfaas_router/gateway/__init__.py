"""The prefill gateway (gateway mode): the router binary in front of a PrFaaS cluster, its link admission (the
core's calendar decision, :mod:`prfaas_core.policy.link_admission`) and its pulls on the wire. Independent of
the request path."""
