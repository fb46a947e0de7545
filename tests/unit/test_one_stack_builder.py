"""One builder of the local two-region stack (prfaas_local.stack.LocalStack): prfaas up, prfaas up --engines
vllm, the benchmarks and the test fixtures build through it. A second builder — any other module that writes both a
gateway-mode config and a router config with a remote — fails here."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

from prfaas_local import real_up, stack, up

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "integration"))

import testbed_support  # noqa: E402


def _python_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=False)
    files = out.stdout.split() if out.returncode == 0 else []
    return files or [str(p.relative_to(REPO)) for p in REPO.rglob("*.py") if ".venv" not in p.parts]


def test_no_second_two_region_builder() -> None:
    builders = []
    for f in _python_files():
        if REPO / f == Path(__file__).resolve():
            continue
        text = (REPO / f).read_text(errors="replace")
        if '"mode": "gateway"' in text and '"remotes"' in text:
            builders.append(f)
    assert builders == ["scheduler/prfaas_local/stack.py"], builders


def test_the_router_fixture_builds_through_the_builder() -> None:
    assert issubclass(testbed_support.Stack, stack.LocalStack)
    source = inspect.getsource(testbed_support)
    assert '"engine", "--role"' not in source and '"link", "--listen"' not in source  # no engines of its own
    assert "stack.start(" in inspect.getsource(testbed_support.start_stack)


def test_prfaas_up_and_the_real_stack_build_through_it() -> None:
    assert inspect.signature(up.stack_for).return_annotation in ("LocalStack", stack.LocalStack)
    field = {f.name: f for f in dataclasses.fields(real_up.RealUp)}["stack"]
    assert field.type in ("LocalStack", stack.LocalStack)
    assert "LocalStack.over_vllm(" in inspect.getsource(real_up.RealUp)


def test_the_routers_and_the_gateway_see_one_link_unless_a_test_asks_otherwise(tmp_path: Path) -> None:
    """The routers send their view of the link with each remote prefill and the gateway refuses one that differs
    (400): the builder gives both the gateway's capacity (``gateway_link_gbps``; the wire keeps ``link_gbps``), and
    a differing view only when asked for (``router_link_gbps``). A reshaped link rewrites the gateway's too."""
    engine = stack.EngineRef("prfaas-0", "http://127.0.0.1:1")
    pd = [stack.EngineRef("pd-0", "http://127.0.0.1:2"), stack.EngineRef("pd-1", "http://127.0.0.1:3")]

    def capacities(**spec: object) -> tuple[float, float]:
        st = stack.LocalStack(stack.StackSpec(gateway_admission=True, **spec), tmp_path)  # type: ignore[arg-type]
        gateway = st.make_gateway_config(engine)
        router = st.make_router_config(pd[:1], pd[1:], None, 0)
        return gateway["links"][0]["capacityGbps"], router["links"][0]["capacityGbps"]

    assert capacities() == (100.0, 100.0)
    assert capacities(gateway_link_gbps=0.005) == (0.005, 0.005)
    assert capacities(gateway_link_gbps=0.005, router_link_gbps=100.0) == (0.005, 100.0)
    st = stack.LocalStack(stack.StackSpec(gateway_admission=True), tmp_path)
    st.write_config("gateway", st.make_gateway_config(engine))
    st.set_gateway_link(5.0)
    assert st.configs["gateway"]["links"][0]["capacityGbps"] == 5.0
