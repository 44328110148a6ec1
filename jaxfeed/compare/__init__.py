"""`jaxfeed compare`: loaders measured side by side on the same work.

``runner`` runs a workload's rows, interleaved, and keeps every repeat;
``workloads`` holds the plug-ins (``copy``: every backend beside the
in-memory ceiling, each framework's tutorial loop and the user's own loader;
``decode``: PNG decoding per worker count beside each framework's pipeline);
``report`` renders tables, target lines and the plot, and ``targets`` checks
jaxfeed's performance targets. The copy workload's rows are described by
``rows``, built from ``baselines`` and ``wrapped`` (a user's loader through
``wrap`` and under Keras ``fit``, trained in new processes by ``fresh``, with
``keras_fit`` the Keras side); the decode workload's idioms are in
``idioms``. ``processes`` measures CPU and peak memory, workers included, and
``training`` holds what both workloads' trainings share.
"""
