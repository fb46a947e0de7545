"""The custom resource kinds: their models, names, scope and printer columns (input to CRD generation)."""

from __future__ import annotations

from dataclasses import dataclass

from ..names import API_GROUP
from .base import ApiModel
from .inter_dc_link import InterDCLink
from .model_profile import ModelProfile
from .pd_cluster import PDCluster
from .prefill_cluster import PrefillCluster


@dataclass(frozen=True)
class PrinterColumn:
    name: str
    type: str
    json_path: str
    description: str
    priority: int = 0


@dataclass(frozen=True)
class ResourceKind:
    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    namespaced: bool
    model: type[ApiModel]
    columns: tuple[PrinterColumn, ...]
    categories: tuple[str, ...] = ("prfaas",)
    scale: bool = False
    """A ``/scale`` subresource: ``spec.instances`` <-> ``status.replicas``, ``status.selector``."""

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{API_GROUP}"


def _ready() -> PrinterColumn:
    return PrinterColumn("Ready", "string", '.status.conditions[?(@.type=="Ready")].status', "Ready condition")


def _age() -> PrinterColumn:
    return PrinterColumn("Age", "date", ".metadata.creationTimestamp", "Age")


KINDS: tuple[ResourceKind, ...] = (
    ResourceKind(
        kind="ModelProfile",
        plural="modelprofiles",
        singular="modelprofile",
        short_names=("mp",),
        namespaced=False,
        model=ModelProfile,
        columns=(
            PrinterColumn("Model", "string", ".spec.servedModelName", "Served model name"),
            PrinterColumn("KV/Token", "number", ".status.kvBytesPerToken", "Growing KV bytes per token"),
            PrinterColumn("Fixed", "number", ".status.fixedKvBytes", "Fixed state bytes per request", 1),
            _ready(),
            _age(),
        ),
    ),
    ResourceKind(
        kind="PrefillCluster",
        plural="prefillclusters",
        singular="prefillcluster",
        short_names=("pfc",),
        namespaced=True,
        model=PrefillCluster,
        scale=True,
        columns=(
            PrinterColumn("Region", "string", ".spec.region", "Region"),
            PrinterColumn("Mode", "string", ".spec.mode", "Managed here or Remote"),
            PrinterColumn("Hardware", "string", ".spec.hardware.accelerator", "Accelerator class"),
            PrinterColumn("Instances", "integer", ".spec.instances", "Declared instances"),
            PrinterColumn("Desired", "integer", ".status.scaling.desiredInstances", "Desired (Operator scaling)", 1),
            PrinterColumn("Ready-Instances", "integer", ".status.readyInstances", "Ready instances"),
            PrinterColumn("Egress-Gbps", "number", ".status.egressGbps", "Measured KV egress", 1),
            PrinterColumn("Site-Cap-Gbps", "number", ".spec.siteEgressCapGbps", "Site egress cap", 1),
            PrinterColumn("Drained", "boolean", ".spec.drained", "Drained for maintenance", 1),
            _ready(),
            _age(),
        ),
    ),
    ResourceKind(
        kind="PDCluster",
        plural="pdclusters",
        singular="pdcluster",
        short_names=("pdc",),
        namespaced=True,
        model=PDCluster,
        scale=True,
        columns=(
            PrinterColumn("Prefill", "string", ".status.summary.prefill", "Ready/desired prefill instances"),
            PrinterColumn("Decode", "string", ".status.summary.decode", "Ready/desired decode instances"),
            PrinterColumn("Threshold", "string", ".status.summary.threshold", "Routing threshold t"),
            PrinterColumn("Link", "string", ".status.summary.link", "Utilisation of the inter-DC link"),
            _ready(),
            PrinterColumn("Last-Decision", "string", ".status.lastDecision.reason", "Last long-term decision"),
            PrinterColumn("Mode", "string", ".spec.roleAssignment.mode", "Relabel or Scale", 1),
            PrinterColumn("Instances", "integer", ".spec.instances", "Declared instances", 1),
            PrinterColumn("Desired", "integer", ".status.scaling.desiredInstances", "Desired (Operator scaling)", 1),
            _age(),
        ),
    ),
    ResourceKind(
        kind="InterDCLink",
        plural="interdclinks",
        singular="interdclink",
        short_names=("idl",),
        namespaced=True,
        model=InterDCLink,
        columns=(
            PrinterColumn("From", "string", ".spec.prefillClusterRef.name", "PrefillCluster"),
            PrinterColumn("To", "string", ".spec.pdClusterRef.name", "PDCluster"),
            PrinterColumn("Capacity-Gbps", "number", ".spec.capacityGbps", "Capacity"),
            PrinterColumn("Cap", "number", ".spec.maxUtilization", "Utilisation cap"),
            PrinterColumn("Util", "string", ".status.utilizationPercent", "Measured utilisation"),
            PrinterColumn("State", "string", ".status.state", "Abundant or Scarce"),
            PrinterColumn("Drained", "boolean", ".spec.drained", "Drained for maintenance", 1),
            _ready(),
            _age(),
        ),
    ),
)

KINDS_BY_NAME: dict[str, ResourceKind] = {k.kind: k for k in KINDS}
