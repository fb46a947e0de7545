"""Reading Prometheus text exposition: the one parser every scraper of ours goes through (the router's
refresher reading engines and links, the CLI's local loop, ``prfaas up`` and the load driver)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from prometheus_client.parser import text_string_to_metric_families


def sample_sums(text: str, names: Collection[str], labels: Mapping[str, str] | None = None) -> dict[str, float]:
    """Per sample name in ``names`` (a counter's ``_total`` name is its sample's), the sum of its samples whose
    labels include ``labels``; a name with no such sample is absent.

    Only the lines that start with a wanted name reach the parser: an engine exposes hundreds of samples (vLLM's
    histograms), the router reads two, and parsing them all took ~28 % of the router's CPU under load (py-spy),
    in slices of the event loop that every relayed stream waited for."""
    wanted = tuple(names)
    if not wanted:
        return {}
    lines = [line for line in text.splitlines() if line.startswith(wanted)]
    out: dict[str, float] = {}
    if not lines:
        return out
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if sample.name in names and (labels is None or all(sample.labels.get(k) == v for k, v in labels.items())):
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def sums_by_labels(text: str, wanted: Mapping[str, tuple[str, ...]]) -> dict[str, dict[tuple[str, ...], float]]:
    """Per sample name in ``wanted``, the sum of its samples per value of its labels ``wanted[name]`` (a label a
    sample lacks counts as ""); a name with no sample is absent. The same line filter as :func:`sample_sums`."""
    lines = [line for line in text.splitlines() if line.startswith(tuple(wanted))]
    out: dict[str, dict[tuple[str, ...], float]] = {}
    if not lines:
        return out
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            keys = wanted.get(sample.name)
            if keys is not None:
                into = out.setdefault(sample.name, {})
                values = tuple(sample.labels.get(k, "") for k in keys)
                into[values] = into.get(values, 0.0) + sample.value
    return out


def sample_sum(text: str, name: str, labels: Mapping[str, str] | None = None) -> float | None:
    """The sum of the samples named ``name`` whose labels include ``labels`` (None: there are none)."""
    return sample_sums(text, (name,), labels).get(name)
