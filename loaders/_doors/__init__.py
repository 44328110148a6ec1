"""One door per framework: every private attribute of another library that
jaxfeed reads, and every quirk it works around, as a small named function.

One module per library (`grain`, `tf`, `hf`, `torch`, `numpy`, `ray`,
`multiprocessing` for the standard library's process pools, `jax`, `keras`). Each
function names the versions it was checked against, and
``tests/loaders/doors/`` calls each on a real object of that framework,
so an upgrade that moves what it reads fails there, with the framework's name
and version, instead of somewhere inside a loader. No module imports its
framework at top level.
"""
