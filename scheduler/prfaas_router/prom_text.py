"""Reading Prometheus text exposition: the one parser every scraper of ours goes through (the router's
refresher reading engines and links, the CLI's local loop, ``prfaas up`` and the load driver)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from prometheus_client.parser import text_string_to_metric_families


def sample_sums(text: str, names: Collection[str], labels: Mapping[str, str] | None = None) -> dict[str, float]:
    """Per sample name in ``names`` (a counter's ``_total`` name is its sample's), the sum of its samples whose
    labels include ``labels``; a name with no such sample is absent."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names and (labels is None or all(sample.labels.get(k) == v for k, v in labels.items())):
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def sample_sum(text: str, name: str, labels: Mapping[str, str] | None = None) -> float | None:
    """The sum of the samples named ``name`` whose labels include ``labels`` (None: there are none)."""
    return sample_sums(text, (name,), labels).get(name)
