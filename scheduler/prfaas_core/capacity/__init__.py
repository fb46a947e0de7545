"""The capacity model (paper §3.4): what a deployment can serve. Hardware and KV models, request-length
workloads and their curves, the planner's inputs, the throughput model (Eqs. 1-8) and the planner.
"""
