"""Discrete-event simulator of PrFaaS-PD, driving the production policies on a virtual clock."""
