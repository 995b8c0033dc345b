"""SLO-driven autoscaling (pure): the policy, each SLO's error budget, and the PromQL of its
signals. Reading Prometheus and running an evaluation are steps of the reconcile pass
(:mod:`disagg.reconcile.evaluate`, :mod:`disagg.reconcile.prometheus`)."""
