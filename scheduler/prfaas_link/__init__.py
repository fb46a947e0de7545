"""The inter-datacenter link emulator (``prfaas link``): a TCP relay from the decode side (region B) to the
prefill side's KV server (region A), shaped to the link's capacity (Gbps, fair-shared round-robin among
concurrent transfers), round-trip time and loss, reconfigurable mid-run, with Prometheus metrics.

* :mod:`.shaper` — the pure fair-share scheduler of serialisation time (no clock, no I/O);
* :mod:`.relay` — the asyncio relay: per connection, both directions shaped (full duplex) and delayed by
  RTT/2; loss costs a retransmission (capacity charged twice, one RTT late); fault knobs;
* :mod:`.metrics` — ``prfaas_link_egress_bytes_total{link}`` (model bytes), wire bytes, utilisation,
  active transfers, capacity and RTT in force;
* :mod:`.admin` — ``/metrics``, ``/admin/state``, ``POST /admin/link`` (capacity, RTT, loss), ``POST
  /admin/faults``.

Capacity and RTT are model values scaled by the scenario's :class:`~prfaas_core.launch.emulation.ScaleSettings` (the
same
setting the engines take): the real rate is ``capacity·byte_scale·time_scale``, so KV of ``S`` model bytes,
sent as ``S·byte_scale`` real bytes, takes ``S·8/capacity`` model seconds. A kernel ``tc`` qdisc in network
namespaces would shape more faithfully (real TCP congestion control), but needs privileges; this relay works
everywhere.
"""

from .config import Endpoint, LinkConfig
from .relay import Link, LinkFaults, LinkShape

__all__ = ["Endpoint", "Link", "LinkConfig", "LinkFaults", "LinkShape"]
