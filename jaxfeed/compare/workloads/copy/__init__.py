"""The copy workload (``jaxfeed compare``'s default): decoded digits through
every backend, beside the in-memory ceiling, each framework's tutorial loop
and the user's own loader object (through ``wrap``, and under Keras ``fit``).

- `workload`: its rows and how one is measured.
- `report`: its targets checked and rendered.
- `rows`: what one row measures.
- `baselines`: the frameworks' tutorial loops.
- `wrapped`: the same objects through ``wrap``.
- `fresh`: their trainings, run in new processes.
- `keras_fit`: the Keras side.
"""

__all__: list[str] = []  # internal: nothing here is public
