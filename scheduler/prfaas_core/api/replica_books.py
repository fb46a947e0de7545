"""The PD prefill books one router replica sends the others (``PUT``
:data:`~prfaas_core.names.REPLICA_BOOKS_PATH`; :mod:`prfaas_core.policy.replica_books` holds and merges them). A
replica that receives its own id answers 409 (it is listed among its peers, or resolved from their Service): the
sender skips that address from then on."""

from __future__ import annotations

from pydantic import Field

from .base import ApiModel


class InstanceBookWire(ApiModel):
    in_flight: int = Field(ge=0, description="The sender's local prefills in flight on this instance.")
    started: int = Field(ge=0, description="The sender's local prefills ever started on it (monotonic).")
    seconds: float = Field(ge=0, description="Their predicted prefill seconds (model time).")


class ReplicaBooksWire(ApiModel):
    """The body (camelCase on the wire)."""

    replica: str = Field(min_length=1, max_length=256, description="The sender's replica id (new at each start).")
    seq: int = Field(ge=0, description="Grows with every change of the sender's books; an older body is ignored.")
    instances: dict[str, InstanceBookWire] = Field(
        default_factory=dict, max_length=4096, description="PD prefill instance name -> the sender's books there."
    )
