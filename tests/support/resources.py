"""Custom resources as raw documents, for the tests that validate them (the model) or check them (the CRD)."""

from __future__ import annotations

from typing import Any


def prefill_cluster_doc(link_scheduling: dict[str, Any]) -> dict[str, Any]:
    """A Managed PrefillCluster of 2 H200 instances on a Deployment, with ``spec.linkScheduling`` as given."""
    return {
        "apiVersion": "prfaas.io/v1alpha1",
        "kind": "PrefillCluster",
        "metadata": {"name": "prfaas-h200", "namespace": "ns"},
        "spec": {
            "region": "region-a",
            "mode": "Managed",
            "modelProfileRef": {"name": "m"},
            "instances": 2,
            "hardware": {"accelerator": "H200", "gpusPerInstance": 8},
            "workload": {"kind": "Deployment", "name": "prefill-engines"},
            "linkScheduling": link_scheduling,
        },
    }
