"""``prfaas plan --budget X`` and ``--cheapest-for-rate R``: size the site and the PD cluster together within a
budget (the core's :mod:`prfaas_core.capacity.budget`), printed as a table or JSON."""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from typing import Any

from prfaas_core.capacity.budget import Priced, cheapest_for_rate, most_goodput_within
from prfaas_core.capacity.plan_inputs import PlanInputError, PlanInputs

from .output import UsageError


class BudgetError(UsageError):
    """A bad budget option (the message names it): a usage error, exit 2."""


class MissingPrices(ValueError):
    """The hardware has no price per instance hour, and no option gives one: exit 1."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--budget",
        type=float,
        metavar="PER_HOUR",
        help="the most throughput whose cost per hour (instances x pricePerInstanceHour + link GB x "
        "--link-price-per-gb) fits this budget",
    )
    p.add_argument(
        "--cheapest-for-rate", type=float, metavar="RPS", help="the cheapest deployment that sustains this rate"
    )
    p.add_argument("--link-price-per-gb", type=float, default=0.0, metavar="X", help="price of one GB over the link")
    p.add_argument(
        "--headroom", type=float, default=1.0, metavar="F", help="--cheapest-for-rate sizes for rate x F (>= 1)"
    )
    p.add_argument(
        "--prfaas-price",
        type=float,
        metavar="PER_HOUR",
        help="price of one PrFaaS instance per hour (overrides the spec)",
    )
    p.add_argument(
        "--pd-price", type=float, metavar="PER_HOUR", help="price of one PD instance per hour (overrides the spec)"
    )
    p.add_argument("--max-prfaas", type=int, default=16, metavar="N", help="most PrFaaS instances searched")
    p.add_argument("--max-pd", type=int, default=64, metavar="N", help="most PD instances searched")


def wanted(args: argparse.Namespace) -> bool:
    return getattr(args, "budget", None) is not None or getattr(args, "cheapest_for_rate", None) is not None


def solve(args: argparse.Namespace, inputs: PlanInputs) -> tuple[PlanInputs, Priced | None]:
    def positive(name: str, value: float) -> None:
        if not (value > 0 and math.isfinite(value)):
            raise BudgetError(f"{name}: must be a positive number, got {value}")

    if args.budget is not None and args.cheapest_for_rate is not None:
        raise BudgetError("--budget and --cheapest-for-rate: give one of them")
    if args.link_price_per_gb < 0 or not math.isfinite(args.link_price_per_gb):
        raise BudgetError(f"--link-price-per-gb: must be >= 0, got {args.link_price_per_gb}")
    if not (args.headroom >= 1 and math.isfinite(args.headroom)):
        raise BudgetError(f"--headroom: must be >= 1, got {args.headroom}")
    if args.max_prfaas < 0 or args.max_pd < 2:
        raise BudgetError("--max-prfaas must be >= 0 and --max-pd >= 2")
    for name, value, side in (("--prfaas-price", args.prfaas_price, "prfaas"), ("--pd-price", args.pd_price, "pd")):
        if value is None:
            continue
        if value < 0 or not math.isfinite(value):
            raise BudgetError(f"{name}: must be >= 0, got {value}")
        if side == "prfaas":
            inputs = replace(inputs, prfaas_hardware=replace(inputs.prfaas_hardware, price_per_instance_hour=value))
        else:
            inputs = replace(inputs, pd_hardware=replace(inputs.pd_hardware, price_per_instance_hour=value))
    try:
        if args.budget is not None:
            positive("--budget", args.budget)
            found = most_goodput_within(inputs, args.budget, args.link_price_per_gb, args.max_prfaas, args.max_pd)
            return inputs, found
        positive("--cheapest-for-rate", args.cheapest_for_rate)
        found = cheapest_for_rate(
            inputs, args.cheapest_for_rate, args.link_price_per_gb, args.max_prfaas, args.max_pd, args.headroom
        )
        return inputs, found
    except PlanInputError as exc:
        raise MissingPrices(f"{exc} (or give --prfaas-price and --pd-price)") from None


def to_dict(args: argparse.Namespace, inputs: PlanInputs, found: Priced | None) -> dict[str, Any]:
    question = (
        {"budgetPerHour": args.budget}
        if args.budget is not None
        else {"rateRps": args.cheapest_for_rate, "headroom": args.headroom}
    )
    out: dict[str, Any] = {**question, "linkPricePerGB": args.link_price_per_gb, "found": found is not None}
    if found is not None:
        pt = found.point
        out.update(
            nPrfaas=pt.n_prfaas,
            nPrefill=pt.n_prefill,
            nDecode=pt.n_decode,
            thresholdTokens=round(pt.split.threshold_tokens),
            throughputRps=round(pt.throughput_rps, 4),
            servedRps=round(found.rate_rps, 4),
            costPerHour=round(found.cost_per_hour, 4),
            instancesPerHour=round(found.instances_per_hour, 4),
            linkPerHour=round(found.link_per_hour, 4),
            linkGBPerHour=round(found.link_gb_per_hour, 3),
            gpus=pt.n_prfaas * inputs.prfaas_hardware.gpus_per_instance
            + (pt.n_prefill + pt.n_decode) * inputs.pd_hardware.gpus_per_instance,
            binding=pt.binding,
        )
    return out


def render(args: argparse.Namespace, inputs: PlanInputs, found: Priced | None) -> str:
    d = to_dict(args, inputs, found)
    ask = f"within {args.budget:g}/h" if args.budget is not None else f"for {args.cheapest_for_rate:g} req/s"
    if found is None:
        return f"no deployment {ask} (searched up to {args.max_prfaas} PrFaaS and {args.max_pd} PD instances)"
    return (
        f"{'most goodput' if args.budget is not None else 'cheapest'} {ask}: "
        f"{d['nPrfaas']} x {inputs.prfaas_hardware.accelerator} PrFaaS + {d['nPrefill']}P/{d['nDecode']}D x "
        f"{inputs.pd_hardware.accelerator}, t = {d['thresholdTokens']} tokens, {d['throughputRps']} req/s at most "
        f"({d['binding']}-bound), {d['gpus']} GPUs\n"
        f"cost {d['costPerHour']}/h at {d['servedRps']} req/s = instances {d['instancesPerHour']}/h + link "
        f"{d['linkGBPerHour']} GB/h x {args.link_price_per_gb:g} = {d['linkPerHour']}/h"
    )
