"""The kopf operator: thin handlers, a keyed work queue, leader election, metrics."""
