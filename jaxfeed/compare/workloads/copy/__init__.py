"""The copy workload (``jaxfeed compare``'s default): decoded digits through
every backend, beside the in-memory ceiling, each framework's tutorial loop
and the user's own loader object (through ``wrap``, and under Keras ``fit``).

``workload`` measures, ``report`` checks targets and renders; ``rows`` says
what one row measures, built from ``baselines`` and ``wrapped``, whose
trainings ``fresh`` runs in new processes (``keras_fit`` is the Keras side).
"""
