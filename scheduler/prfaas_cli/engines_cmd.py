"""``prfaas engines FILES... -o json``: the engine command, args and env per cluster and role, rendered from the
PrefillClusters, PDClusters and ModelProfiles in FILES through the one engine-flag function (``engine_launch``).

``-o json`` prints ``{cluster: {role: {command, args, env, kvTransferConfig}}}``; ``-o helm-values`` prints
the chart's engine-args file (``{clusters: {cluster: {kind, roles: {role: {launch, ports}}}}}``; the chart ships
``helm/prfaas/files/engines.json``, the examples' rendering, kept current by ``scripts/sync_chart_files.py
--check``; pass your own with ``--set-file engines.launchesJson=FILE``). Remote PrefillClusters run in the
other region and are skipped.
Exit 2 when a manifest is invalid or a cluster cannot render (the message names the field and why).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from prfaas_core.launch.engines import EngineSpec
from prfaas_core.launch.render import RenderError, engine_specs, render_all
from prfaas_core.launch.vllm import DEFAULT_MOONCAKE_BOOTSTRAP_PORT, DEFAULT_SIDE_CHANNEL_PORT
from prfaas_local.manifests import InputError, add_manifest_args, load_clusters

from .output import EXIT_OK, add_output_arg, emit, error


def register(sub: Any) -> None:
    p = sub.add_parser(
        "engines",
        help="render the engines' command, args and env per cluster and role from the custom resources",
        description=__doc__,
    )
    add_manifest_args(p)
    add_output_arg(p, human=None, extra=("helm-values",))
    p.set_defaults(handler=run)


def render_files(files: Sequence[str], namespace: str = "default") -> dict[str, dict[str, dict[str, object]]]:
    """``{cluster: {role: launch}}`` for the manifests in ``files``; InputError on invalid input."""
    clusters, profiles = load_clusters(files, namespace)
    try:
        return render_all(clusters, profiles)
    except RenderError as exc:
        raise InputError(str(exc)) from None


def _ports(spec: EngineSpec) -> dict[str, Any]:
    """The ports a pod of ``spec`` listens on, for the chart's container ports, Services and NetworkPolicies."""
    default = DEFAULT_SIDE_CHANNEL_PORT if spec.connector == "NixlConnector" else DEFAULT_MOONCAKE_BOOTSTRAP_PORT
    data = spec.ucx_tcp_port_range if spec.connector == "NixlConnector" else None
    return {
        "http": spec.port,
        "sideChannel": spec.side_channel_port or default,
        "kvData": {"start": data[0], "end": data[1]} if data else None,
        "kvEvents": spec.kv_events_port,
    }


def helm_values(files: Sequence[str], namespace: str = "default") -> dict[str, Any]:
    """The chart's engine-args file: per cluster its kind, and per role the rendered launch (the same JSON as
    ``-o json``) and the ports the pod listens on. The chart's templates copy these; they compute nothing."""
    clusters, profiles = load_clusters(files, namespace)
    try:
        launches = render_all(clusters, profiles)
        out: dict[str, Any] = {}
        for c in clusters:
            if c.metadata.name not in launches:
                continue
            specs = engine_specs(c, profiles.get(c.spec.model_profile_ref.name))
            out[c.metadata.name] = {
                "kind": c.kind,
                "roles": {
                    role: {"launch": launches[c.metadata.name][role], "ports": _ports(spec)}
                    for role, spec in specs.items()
                },
            }
    except RenderError as exc:
        raise InputError(str(exc)) from None
    return {"generatedBy": "prfaas engines -o helm-values", "clusters": out}


def run(args: argparse.Namespace) -> int:
    try:
        out = (
            helm_values(args.files, args.namespace)
            if args.output == "helm-values"
            else render_files(args.files, args.namespace)
        )
    except InputError as exc:
        return error(str(exc))
    if args.output == "yaml":
        emit(out, "yaml")
    else:  # the chart reads helm-values as JSON (sorted keys: stable diffs of the generated file)
        print(json.dumps(out, indent=2, sort_keys=True))
    return EXIT_OK
