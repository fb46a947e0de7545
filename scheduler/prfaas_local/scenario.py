"""``prfaas up``'s scenario: traffic and link conditions in phases (YAML, camelCase keys).

Each phase lasts ``durationSeconds`` of model time and sets, for its span, the arrival rate (``load``: a
fraction of the planner's ``Λ_max`` for the declared workload), the uncached input-length mix
(``inputLength``, as a WorkloadSpec's) and the link's capacity (``linkGbps``: at the phase's start the link
emulator is reshaped live and the capacity published to the router, as the operator does from an
InterDCLink). A field a phase leaves out keeps the previous phase's value. ``expect`` is prose: what the
phase should show (printed with the phase, asserted by tests/e2e/test_up.py for the default).

The default scenario (``DEFAULT_SCENARIO``, also examples/05-up/phases.yaml) runs steady traffic, a shift to
long prompts, a link squeeze and a recovery.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import Field, ValidationError

from prfaas_core.api.base import ApiModel
from prfaas_core.capacity.workload import InputLengthSpec, LengthDistribution, distribution_from_spec
from prfaas_core.request.trace import TraceRecord

from .formats import os_error, yaml_error

DEFAULT_SCENARIO = Path(__file__).parent / "data" / "up-phases.yaml"


class PhaseSpec(ApiModel):
    name: str = Field(min_length=1, max_length=40, pattern=r"^[a-z0-9][a-z0-9-]*$", description="Phase name.")
    duration_seconds: float = Field(gt=0, le=86_400, description="Model seconds the phase lasts.")
    load: float | None = Field(default=None, ge=0, le=10, description="Arrival rate / the planner's Λ_max.")
    input_length: InputLengthSpec | None = Field(default=None, description="Uncached input-length mix.")
    link_gbps: float | None = Field(default=None, gt=0, le=100_000, description="Link capacity, model Gbps.")
    expect: str = Field(default="", max_length=400, description="What the phase should show.")


class LoopSpec(ApiModel):
    """The long-term loop's knobs for the run (short periods: a local run lasts minutes)."""

    period_seconds: float = Field(default=20.0, gt=0)
    hysteresis_cycles: int = Field(default=2, ge=1)
    cooldown_seconds: float = Field(default=60.0, ge=0)
    drain_timeout_seconds: float = Field(default=30.0, gt=0)
    flip_to_decode_ratio: float = Field(default=1.25, gt=0)
    flip_to_prefill_ratio: float = Field(default=0.8, gt=0)


class ElasticSpec(ApiModel):
    """Elastic capacity for the run: both clusters grow from the sizes the stack starts at (their min) up to their
    max with demand, and back (``prfaas_local/up_elastic.py``; the core's decision, short periods)."""

    prfaas_max_instances: int = Field(default=3, ge=1, le=8, description="Most PrFaaS engines.")
    pd_max_instances: int = Field(default=6, ge=2, le=16, description="Most PD engines.")
    period_seconds: float = Field(default=5.0, gt=0, description="Model seconds between two decisions.")
    rate_window_seconds: float = Field(default=15.0, gt=0, description="Model seconds the rates cover.")
    scale_down_stabilization_seconds: float = Field(default=20.0, ge=0)
    startup_seconds: float = Field(default=10.0, ge=0, description="An engine's start-up (the forecast horizon).")
    prfaas_target_utilization: float = Field(default=0.8, gt=0, le=1, description="The site plans for this share.")
    pd_target_utilization: float = Field(default=0.8, gt=0, le=1, description="The PD cluster plans for this share.")
    tolerance: float = Field(default=0.1, ge=0, lt=1)
    drain_timeout_seconds: float = Field(default=60.0, gt=0)
    settle_seconds: float = Field(
        default=300.0, ge=0, description="After the replay: model seconds to wait for both clusters back at min."
    )


class ScenarioSpec(ApiModel):
    description: str = Field(default="", max_length=2000)
    output_tokens: int = Field(default=32, ge=1, le=100_000, description="Output tokens per request.")
    time_scale: float = Field(default=2.0, gt=0, le=1000, description="Model seconds per wall second.")
    link_gbps: float = Field(default=100.0, gt=0, le=100_000, description="The link's capacity at the start.")
    loop: LoopSpec = Field(default_factory=LoopSpec)
    elastic: ElasticSpec | None = Field(default=None, description="Elastic capacity (absent: fixed sizes).")
    phases: list[PhaseSpec] = Field(min_length=1, max_length=50)


@dataclass(frozen=True)
class Phase:
    """A phase with every field resolved (inherited from the phases before it)."""

    name: str
    start_s: float
    end_s: float
    load: float
    lengths: LengthDistribution
    link_gbps: float
    expect: str

    def contains(self, model_s: float) -> bool:
        return self.start_s <= model_s < self.end_s


class ScenarioError(ValueError):
    """The scenario file is unreadable or invalid (names the file and the field)."""


def load_scenario(path: Path) -> ScenarioSpec:
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ScenarioError(os_error(f"--scenario {path}", exc)) from None
    except yaml.YAMLError as exc:
        raise ScenarioError(yaml_error(f"--scenario {path}", exc)) from None
    try:
        return ScenarioSpec.model_validate(raw)
    except ValidationError as exc:
        errors = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors())
        raise ScenarioError(f"--scenario {path}: {errors}") from None


def single_phase(
    load: float, duration_s: float, link_gbps: float, output_tokens: int, time_scale: float
) -> ScenarioSpec:
    """The one-phase scenario of ``--load``/``--duration`` (the paper's length mix, constant load and link)."""
    phase = PhaseSpec(name="steady", duration_seconds=duration_s, load=load)
    return ScenarioSpec(output_tokens=output_tokens, time_scale=time_scale, link_gbps=link_gbps, phases=[phase])


def resolve(spec: ScenarioSpec, default_lengths: LengthDistribution) -> list[Phase]:
    """The phases with start/end times and every inherited field filled in."""
    out: list[Phase] = []
    t, load, lengths, link = 0.0, 0.5, default_lengths, spec.link_gbps
    for i, p in enumerate(spec.phases):
        if p.load is not None:
            load = p.load
        elif i == 0:
            raise ScenarioError(f"phases[0] ({p.name}): load is required in the first phase")
        if p.input_length is not None:
            try:
                lengths = distribution_from_spec(p.input_length)
            except ValueError as exc:
                raise ScenarioError(f"phases[{i}] ({p.name}).inputLength: {exc}") from None
        if p.link_gbps is not None:
            link = p.link_gbps
        out.append(Phase(p.name, t, t + p.duration_seconds, load, lengths, link, p.expect))
        t += p.duration_seconds
    if len({p.name for p in out}) != len(out):
        raise ScenarioError("phases: names must be unique")
    return out


def phase_at(phases: list[Phase], model_s: float) -> Phase:
    for p in phases:
        if p.contains(model_s):
            return p
    return phases[-1]


def generate_trace(phases: list[Phase], lambda_max_rps: float, output_tokens: int, seed: int) -> list[TraceRecord]:
    """Poisson arrivals at each phase's rate with its length mix, single-turn sessions."""
    rng = random.Random(seed)
    out: list[TraceRecord] = []
    for phase in phases:
        rate = phase.load * lambda_max_rps
        if rate <= 0:
            continue
        t = phase.start_s
        while True:
            t += rng.expovariate(rate)
            if t >= phase.end_s:
                break
            out.append(
                TraceRecord(
                    arrival_s=t,
                    input_tokens=phase.lengths.sample(rng),
                    output_tokens=output_tokens,
                    session_id=f"s{len(out)}",
                    shared_prefix_tokens=0,
                )
            )
    return out


__all__ = [
    "DEFAULT_SCENARIO",
    "ElasticSpec",
    "Phase",
    "PhaseSpec",
    "ScenarioError",
    "ScenarioSpec",
    "generate_trace",
    "load_scenario",
    "phase_at",
    "resolve",
    "single_phase",
]
