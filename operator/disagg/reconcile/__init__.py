"""The kopf operator: thin handlers, a keyed work queue, leader election, metrics, and the
reconcile pass with its autoscaler evaluation and Prometheus reader."""
