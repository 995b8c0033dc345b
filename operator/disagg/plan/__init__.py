"""Capacity planning: should a workload be disaggregated, and with how many replicas."""
