"""`jaxfeed compare`: every backend on the same work, beside reference loops.

``run`` measures, ``report`` derives ratios and renders tables and plots,
``baselines`` holds the in-memory ceiling and each framework's tutorial loop,
``rows`` what one row measures, ``wrapped`` the rows for a user's own loader
(through ``wrap``, and under Keras ``fit``), whose trainings ``fresh`` runs
in new processes (``keras_fit`` is the Keras side).
"""
