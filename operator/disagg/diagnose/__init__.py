"""`disagg diagnose`: is a running model's TPOT hurt by prefill interference, by overload, or
by nothing, read from the engines' own metrics in Prometheus.

``series`` builds the range queries and lines their answers up per step, ``verdict`` decides,
``advice`` turns a verdict into the next step of the decision order (chunk, then split, or
scale), and ``cli`` is the only part that talks to Prometheus and prints.
"""
