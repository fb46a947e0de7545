"""The typed API: custom resources (spec + status) and the router's configuration."""

from .admission import AdmissionDecline, GatewayAdmission
from .base import ApiModel, CelRule, Condition, LocalObjectRef, ObjectMeta, SecretKeyRef, WorkloadRef
from .common import DecisionRecord, GatewayEndpointSpec, KvTransportSpec, RoleRange, SloSpec, TtftSlo
from .gateway import GatewayStatus
from .hardware import DecodeCapacitySpec, HardwareSpec, PrefillPolynomial, PrefillTimePoint, PrefillTimeSpec
from .inter_dc_link import InterDCLink, InterDCLinkSpec, InterDCLinkStatus
from .model_profile import (
    MeasuredKvPoint,
    MeasuredKvTable,
    ModelArchitecture,
    ModelProfile,
    ModelProfileSpec,
    ModelTokenizerSpec,
)
from .pd_cluster import LongTermPolicySpec, PDCluster, PDClusterSpec, PDClusterStatus
from .prefill_cluster import (
    LinkSchedulingSpec,
    PrefillCluster,
    PrefillClusterSpec,
    PrefillClusterStatus,
    ScheduledLink,
    SiteCapStatus,
    SiteLinkStatus,
)
from .replica_books import InstanceBookWire, ReplicaBooksWire
from .resources import KINDS, KINDS_BY_NAME, ResourceKind
from .router_config import RemoteGateway, RouterConfig, RouterEndpoint, RouterLink

__all__ = [
    "KINDS",
    "KINDS_BY_NAME",
    "AdmissionDecline",
    "ApiModel",
    "CelRule",
    "Condition",
    "DecisionRecord",
    "DecodeCapacitySpec",
    "GatewayAdmission",
    "GatewayEndpointSpec",
    "GatewayStatus",
    "HardwareSpec",
    "InstanceBookWire",
    "InterDCLink",
    "InterDCLinkSpec",
    "InterDCLinkStatus",
    "KvTransportSpec",
    "LinkSchedulingSpec",
    "LocalObjectRef",
    "LongTermPolicySpec",
    "MeasuredKvPoint",
    "MeasuredKvTable",
    "ModelArchitecture",
    "ModelProfile",
    "ModelProfileSpec",
    "ModelTokenizerSpec",
    "ObjectMeta",
    "PDCluster",
    "PDClusterSpec",
    "PDClusterStatus",
    "PrefillCluster",
    "PrefillClusterSpec",
    "PrefillClusterStatus",
    "PrefillPolynomial",
    "PrefillTimePoint",
    "PrefillTimeSpec",
    "RemoteGateway",
    "ReplicaBooksWire",
    "ResourceKind",
    "RoleRange",
    "RouterConfig",
    "RouterEndpoint",
    "RouterLink",
    "ScheduledLink",
    "SecretKeyRef",
    "SiteCapStatus",
    "SiteLinkStatus",
    "SloSpec",
    "TtftSlo",
    "WorkloadRef",
]
