"""The mixtures workload (``jaxfeed compare --workload mixtures``): datasets
mixed by weight on every jaxfeed backend, beside each framework's own
mixture, with the shares each one realized.

- `workload`: its components, rows (the idioms too) and how one is measured.
- `report`: its table.
"""

__all__: list[str] = []  # internal: nothing here is public
