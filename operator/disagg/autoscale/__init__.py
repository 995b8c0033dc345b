"""SLO-driven autoscaling: the pure policy and PromQL, the Prometheus reader, one evaluation."""
