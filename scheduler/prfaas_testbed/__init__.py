"""The local testbed around the operator: a Kubernetes API emulator (kmock, the ``test`` extra), a real
Prometheus scraping a fake exporter, and the operator run as a process against them — shared by the
integration tests, ``benchmarks/operator_scale.py`` and ``scripts/render_dashboard.py``."""
