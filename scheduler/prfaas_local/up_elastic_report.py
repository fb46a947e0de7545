"""``prfaas up``'s elastic capacity, set up and reported: the loops' settings from a scenario's ``elastic`` block,
the delays around the demand step (model seconds), the summary's ``elastic`` block and up.png's capacity panel."""

from __future__ import annotations

from typing import Any

from prfaas_core.policy.elastic import ScaleBehavior, ScaleBounds

from .up_elastic import CapacitySample, ElasticSettings


def settings_of(spec: Any, n_prfaas: int, n_pd: int) -> ElasticSettings:
    """The loops' settings from a scenario's ``elastic`` block; the min of each cluster is its starting size."""
    behavior = ScaleBehavior(
        tolerance=spec.tolerance,
        scale_down_window_s=spec.scale_down_stabilization_seconds,
        startup_s=spec.startup_seconds,
    )
    if spec.prfaas_max_instances < n_prfaas or spec.pd_max_instances < n_pd:
        raise ValueError(
            f"elastic: prfaasMaxInstances ({spec.prfaas_max_instances}) and pdMaxInstances ({spec.pd_max_instances}) "
            f"must be at least the sizes the stack starts at (--prfaas {n_prfaas}, --pd {n_pd})"
        )
    return ElasticSettings(
        ScaleBounds(n_prfaas, spec.prfaas_max_instances),
        ScaleBounds(n_pd, spec.pd_max_instances),
        behavior,
        spec.period_seconds,
        spec.rate_window_seconds,
        spec.prfaas_target_utilization,
        spec.pd_target_utilization,
        spec.drain_timeout_seconds,
        spec.settle_seconds,
    )


def step_and_fall(phases: list[Any]) -> tuple[float, float] | None:
    """When demand steps up (the first phase whose load is above the one before) and falls back (the next phase
    whose load is below it): model seconds; None without a step."""
    for i in range(1, len(phases)):
        if phases[i].load > phases[i - 1].load:
            fall = next((p.start_s for p in phases[i + 1 :] if p.load < phases[i].load), phases[-1].end_s)
            return phases[i].start_s, fall
    return None


def elastic_summary(st: Any, base: dict[str, int], phases: list[Any]) -> dict[str, Any]:
    """The run's elastic capacity: the delays around the demand step, every decision that moved or was blocked."""
    samples: list[CapacitySample] = st.capacity
    out: dict[str, Any] = {"decisions": st.elastic_decisions}
    times = step_and_fall(phases)
    if times is not None:
        out["demand_step_model_s"], out["demand_fall_model_s"] = times
        out["clusters"] = delays(samples, times[0], times[1], base)
    out["timeline"] = [
        {"model_s": round(s.model_s, 1), "cluster": s.cluster, "desired": s.desired, "ready": s.ready,
         "demand": round(s.demand, 2)}
        for s in samples
    ]  # fmt: skip
    return out


def delays(samples: list[CapacitySample], step_s: float, fall_s: float, base: dict[str, int]) -> dict[str, Any]:
    """Per cluster, model seconds from the demand step to the first scale-out asked for and to the first added
    instance ready, and from the fall to the first scale-in and to the size back at its start."""
    out: dict[str, Any] = {}
    for name, n0 in base.items():
        mine = [s for s in samples if s.cluster == name]

        def first(cond: Any, since: float, mine: list[CapacitySample] = mine) -> float | None:
            hit = next((s.model_s for s in mine if s.model_s >= since and cond(s)), None)
            return None if hit is None else round(hit - since, 1)

        peak = max((s.desired for s in mine if step_s <= s.model_s), default=n0)
        out[name] = {
            "start": n0,
            "peak_desired": peak,
            "peak_ready": max((s.ready for s in mine if step_s <= s.model_s), default=0),
            "scale_out_asked_s": first(lambda s, n0=n0: s.desired > n0, step_s),
            "scale_out_ready_s": first(lambda s, n0=n0: s.ready > n0, step_s),
            "scale_in_asked_s": first(lambda s, peak=peak: s.desired < peak, fall_s),
            "back_to_start_s": first(lambda s, n0=n0: s.desired == n0, fall_s),
            "end_desired": mine[-1].desired if mine else n0,
        }
    return out


def draw_capacity(ax: Any, samples: list[CapacitySample]) -> None:
    """Desired vs ready instances per cluster, against its demand (in instances)."""
    from matplotlib.ticker import MaxNLocator

    for name, colour, label in (("prfaas", "tab:orange", "PrFaaS site"), ("pd", "tab:blue", "PD cluster")):
        mine = [s for s in samples if s.cluster == name]
        if not mine:
            continue
        xs = [s.model_s for s in mine]
        ax.step(xs, [s.desired for s in mine], where="post", color=colour, label=f"{label} desired")
        ax.step(xs, [s.ready for s in mine], where="post", color=colour, ls=":", label=f"{label} ready")
        ax.plot(xs, [s.demand for s in mine], color=colour, alpha=0.45, lw=3, label=f"{label} demand")
    ax.set_ylabel("instances")
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("Elastic capacity: desired vs ready instances per cluster, against demand (each region's loop)")


__all__ = ["delays", "draw_capacity", "elastic_summary", "settings_of", "step_and_fall"]
