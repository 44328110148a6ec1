"""The decode workload (``jaxfeed compare --workload decode``): PNG digits
decoded and augmented per record, per worker count, each jaxfeed backend
beside its framework's own pipeline.

``workload`` measures, ``report`` checks targets and renders; ``rows`` says
what one row (a pipeline) opens, and ``idioms`` holds the frameworks' own
pipelines.
"""
