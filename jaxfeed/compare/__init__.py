"""`jaxfeed compare`: every backend on the same work, beside reference loops.

``run`` measures, ``report`` derives ratios and renders tables and plots,
``baselines`` holds the in-memory ceiling and each framework's tutorial loop.
"""
