"""Engine instances: a FIFO prefill server and a batched decode server (one class, since a PD instance can
hold either role and, after a forced flip, finish the other role's work in flight).

* **Prefill** (paper Eqs. 3–4): one request at a time, ``T_prefill(l)`` of the instance's hardware for the
  ``l`` uncached tokens. Service is deterministic once queued, so start and end are known at enqueue time
  (``busy_until``); a job not yet started can be withdrawn (a forced flip) and re-dispatched.
* **Decode** (Eq. 5): ``BS_max`` slots; a stream holds a slot for ``L_out·T_decode`` (one token per step,
  the first one after the first step), so one instance serves ``BS_max/(T_decode·L_out)`` req/s. A stream
  with no free slot waits, FIFO. ``T_decode`` is the profile's SLO-governed constant (paper §3.4.1).
"""

from __future__ import annotations

from collections import deque
from typing import Literal

InstanceRole = Literal["prefill", "decode"]


class Job:
    """One request's prefill on one instance (``gen`` bumps when it is withdrawn)."""

    __slots__ = ("duration_s", "end_s", "gen", "instance", "req", "start_s")

    def __init__(self, req: object, instance: Instance, start_s: float, duration_s: float) -> None:
        self.req = req
        self.instance = instance
        self.start_s = start_s
        self.duration_s = duration_s
        self.end_s = start_s + duration_s
        self.gen = 0


class Instance:
    """One engine instance (8 GPUs)."""

    __slots__ = (
        "active",
        "available_at_s",
        "busy_until_s",
        "cluster",
        "decode_slots",
        "draining",
        "generated_tokens",
        "name",
        "prefill_jobs",
        "prefills",
        "prompt_tokens",
        "role",
        "waiting",
    )

    def __init__(self, name: str, cluster: str, role: InstanceRole, decode_slots: int) -> None:
        self.name = name
        self.cluster = cluster
        self.role: InstanceRole = role
        self.draining = False
        self.available_at_s = 0.0
        self.busy_until_s = 0.0
        self.prefill_jobs: deque[Job] = deque()
        """Prefill jobs not finished yet, in FIFO order (the first may be in service)."""
        self.decode_slots = decode_slots
        self.active = 0
        """Decode streams holding a slot."""
        self.waiting: deque[object] = deque()
        """Decode streams waiting for a slot."""
        self.prompt_tokens = 0
        self.prefills = 0
        self.generated_tokens = 0
        """Counters, as vLLM's per-pod ``prompt_tokens_total``, requests and ``generation_tokens_total``."""

    # --- prefill -----------------------------------------------------------------------------------------

    def enqueue_prefill(self, req: object, now_s: float, duration_s: float) -> Job:
        start = self.busy_until_s if self.busy_until_s > now_s else now_s
        job = Job(req, self, start, duration_s)
        self.busy_until_s = job.end_s
        self.prefill_jobs.append(job)
        return job

    def queued_prefill_s(self, now_s: float) -> float:
        """Predicted prefill work ahead of a new job, seconds."""
        return self.busy_until_s - now_s if self.busy_until_s > now_s else 0.0

    def prefill_waiting(self, now_s: float) -> int:
        """Prefill jobs queued and not started (FIFO: only the head can be in service)."""
        jobs = self.prefill_jobs
        return len(jobs) - 1 if jobs and jobs[0].start_s <= now_s else len(jobs)

    def prefill_busy(self, now_s: float) -> bool:
        return bool(self.prefill_jobs) and self.prefill_jobs[0].start_s <= now_s

    def finish_prefill(self, job: Job) -> None:
        self.prefills += 1
        self.prompt_tokens += getattr(job.req, "uncached", 0)
        jobs = self.prefill_jobs
        if jobs and jobs[0] is job:
            jobs.popleft()
        else:  # pragma: no cover - FIFO service always finishes the head
            jobs.remove(job)

    def withdraw_unstarted(self, now_s: float) -> list[Job]:
        """Take back the jobs not started (a forced flip): they are re-dispatched elsewhere."""
        keep: deque[Job] = deque()
        out: list[Job] = []
        for job in self.prefill_jobs:
            if job.start_s > now_s:
                job.gen += 1
                out.append(job)
            else:
                keep.append(job)
        self.prefill_jobs = keep
        self.busy_until_s = keep[-1].end_s if keep else now_s
        return out

    # --- decode ------------------------------------------------------------------------------------------

    @property
    def decode_load(self) -> int:
        """Streams holding or waiting for a slot."""
        return self.active + len(self.waiting)

    def in_flight(self) -> int:
        return len(self.prefill_jobs) + self.active + len(self.waiting)


def least_wait(pool: list[Instance], now: float) -> float | None:
    """The queued prefill work on the least-loaded available prefill instance (what a router predicts)."""
    waits = [
        i.queued_prefill_s(now) for i in pool if i.role == "prefill" and not i.draining and now >= i.available_at_s
    ]
    return min(waits) if waits else None
