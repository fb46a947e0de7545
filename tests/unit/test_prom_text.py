"""The one Prometheus text reader: only the wanted lines are parsed, with the same sums as parsing everything."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from prfaas_router.state.metrics import sample_sum, sample_sums


def _exposition() -> str:
    r = CollectorRegistry()
    waiting = Gauge("vllm:num_requests_waiting", "w", ["model_name", "engine"], registry=r)
    waiting.labels("m", "0").set(3)
    waiting.labels("m", "1").set(4)
    Gauge("vllm:num_requests_waiting_extra", "a longer name sharing the prefix", registry=r).set(100)
    Gauge("vllm:num_requests_running", "r", ["model_name"], registry=r).labels('quote " and \\ and \n').set(2)
    tokens = Counter("vllm:prompt_tokens", "p", ["model_name"], registry=r)
    tokens.labels("m").inc(7)
    tokens.labels("other").inc(5)
    h = Histogram("vllm:e2e_request_latency_seconds", "h", ["model_name"], registry=r)
    for v in (0.1, 0.5, 3.0):
        h.labels("m").observe(v)
    return generate_latest(r).decode()


def _full(text: str, names: tuple[str, ...], labels: dict[str, str] | None = None) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in names and (labels is None or all(s.labels.get(k) == v for k, v in labels.items())):
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def test_the_wanted_lines_sum_as_a_full_parse_does() -> None:
    text = _exposition()
    cases: list[tuple[tuple[str, ...], dict[str, str] | None]] = [
        (("vllm:num_requests_waiting", "vllm:num_requests_running"), None),
        (("vllm:num_requests_waiting",), {"engine": "1"}),
        (("vllm:prompt_tokens_total",), {"model_name": "m"}),
        (("vllm:e2e_request_latency_seconds_count", "vllm:e2e_request_latency_seconds_sum"), None),
        (("vllm:e2e_request_latency_seconds_bucket",), {"le": "1.0"}),
        (("absent",), None),
        ((), None),
    ]
    for names, labels in cases:
        assert sample_sums(text, names, labels) == _full(text, names, labels), names
    assert sample_sums(text, ("vllm:num_requests_waiting",)) == {"vllm:num_requests_waiting": 7.0}
    assert sample_sum(text, "vllm:num_requests_running") == 2.0  # the escaped label value parsed
    assert sample_sum(text, "vllm:prompt_tokens_total", {"model_name": "m"}) == 7.0
    assert sample_sum(text, "absent") is None


def test_sums_by_labels_groups_each_wanted_name_by_its_labels() -> None:
    from prfaas_router.state.metrics import sums_by_labels

    text = (
        "# TYPE prfaas_gateway_admissions counter\n"
        'prfaas_gateway_admissions_total{link="a",result="booked"} 3\n'
        'prfaas_gateway_admissions_total{link="b",result="booked"} 2\n'
        'prfaas_gateway_admissions_total{link="a",result="kv_lease"} 1\n'
        'prfaas_gateway_admissions_created{link="a",result="booked"} 1.7e9\n'
        'prfaas_gateway_pulls_total{link="a"} 4\n'
        "other_total 9\n"
    )
    wanted = {
        "prfaas_gateway_admissions_total": ("result",),
        "prfaas_gateway_pulls_total": ("end",),
        "absent_total": (),
    }
    assert sums_by_labels(text, wanted) == {
        "prfaas_gateway_admissions_total": {("booked",): 5.0, ("kv_lease",): 1.0},
        "prfaas_gateway_pulls_total": {("",): 4.0},  # a label the sample lacks counts as ""
    }
    assert sums_by_labels("", wanted) == {}
