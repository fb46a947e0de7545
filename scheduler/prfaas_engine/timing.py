"""Service times of the emulated instance, in model seconds, from the core's hardware profile.

* Prefill of ``u`` uncached tokens takes ``T_prefill(u)`` (the profile's curve: paper Table 5 for H200, the
  Table 6 fit for H20). With chunked prefill the chunks ending at ``u_1 < u_2 < … < u`` cost
  ``T(u_1), T(u_2) − T(u_1), …``, so they add up to ``T(u)`` and decodes can interleave between chunks.
* A decode step of a batch of ``b`` streams takes ``T_decode·(α + (1 − α)·b/BS_max)`` with ``α = 1/2``: a
  memory-bound step reads the weights once (the fixed half) and each stream's KV (the per-stream half); at
  ``b = BS_max`` it is the profile's ``T_decode`` (the SLO operating point, paper Eq. 5).
"""

from __future__ import annotations

from dataclasses import dataclass

from prfaas_core.capacity.hardware import DecodeCapacity, HardwareProfile

DECODE_FIXED_FRACTION = 0.5
FALLBACK_DECODE = DecodeCapacity(max_batch_size=32, step_time_s=0.025)


@dataclass(frozen=True)
class ServiceTimes:
    hardware: HardwareProfile

    @property
    def decode(self) -> DecodeCapacity:
        return self.hardware.decode or FALLBACK_DECODE

    def prefill_s(self, uncached_tokens: int) -> float:
        """``T_prefill(u)``, u ≥ 1 (a full prefix hit still computes the last token)."""
        return max(self.hardware.prefill_seconds(max(uncached_tokens, 1)), 0.0)

    def prefill_chunk_s(self, done_tokens: int, chunk_end_tokens: int) -> float:
        """Model seconds of the chunk taking the uncached prefill from ``done_tokens`` to ``chunk_end_tokens``."""
        end = self.prefill_s(chunk_end_tokens)
        return end if done_tokens <= 0 else max(end - self.prefill_s(done_tokens), 0.0)

    def decode_step_s(self, batch: int) -> float:
        """One decode step of ``batch`` streams (0 when the batch is empty)."""
        if batch <= 0:
            return 0.0
        d = self.decode
        return d.step_time_s * (DECODE_FIXED_FRACTION + (1 - DECODE_FIXED_FRACTION) * batch / d.max_batch_size)


def chunk_ends(uncached_tokens: int, chunk_tokens: int) -> list[int]:
    """Cumulative uncached-token counts at the end of each prefill chunk (at least one chunk)."""
    total = max(uncached_tokens, 1)
    ends = list(range(chunk_tokens, total, chunk_tokens))
    ends.append(total)
    return ends
