"""The pure core of the PrFaaS control plane.

Owns every decision (routing, threshold, role counts, plans), the typed API that the custom resources are
generated from, and the equations of the paper. Imports no I/O library: shells (router, operator, CLI)
gather inputs, call the core, and apply the results.
"""

__version__ = "0.1.0"
