"""ModelProfile reconcile: the KV model the core derives from the profile, summarised in status."""

from __future__ import annotations

from prfaas_core.api import ModelProfile
from prfaas_core.api.model_profile import ModelProfileStatus
from prfaas_core.capacity.kv import KvModelError, kv_model_from_profile
from prfaas_core.names import KIND_MODEL_PROFILE

from .kube import KubeApi
from .logs import logger
from .registry import Entry
from .status import changed_reason, get_condition, post_event, set_condition
from .writer import StatusWriter


async def reconcile(api: KubeApi, writer: StatusWriter, entry: Entry, now_s: float) -> None:
    log = logger(KIND_MODEL_PROFILE, None, entry.name)
    gen = entry.generation
    conds = entry.read_status(ModelProfileStatus).conditions
    if entry.paused:
        await writer.write_paused(entry, ModelProfileStatus, conds, now_s)
        return
    reason, message = "", ""
    derived: dict[str, float] = {}
    if not entry.valid:
        reason, message = "InvalidSpec", "; ".join(entry.problems)
    else:
        profile: ModelProfile = entry.model
        try:
            kv = kv_model_from_profile(profile.spec)
        except (KvModelError, ValueError) as exc:
            reason, message = "InvalidProfile", str(exc)
        else:
            derived = {"kv_bytes_per_token": round(kv.bytes_per_token, 3), "fixed_kv_bytes": round(kv.fixed_bytes, 3)}
    old = get_condition(conds, "Ready")
    if reason:
        conds = set_condition(conds, "Ready", False, reason, message, now_s, gen)
    else:
        conds = set_condition(conds, "Ready", True, "Reconciled", f"KV model from {kv.source}", now_s, gen)
    await writer.write(entry, ModelProfileStatus(observed_generation=gen, **derived, conditions=conds))
    if reason and changed_reason(old, reason, message):
        log.warning("not ready", reason=reason, message=message)
        await post_event(api, entry.body, "Warning", reason, message, now_s)
