"""Package discovery: the design card keeps `loaders/` and `sharding/` at the
top of the repository; they install as `jaxfeed.loaders` and `jaxfeed.sharding`,
so users import one root and no generic name (`loaders`) enters their
environment. Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

ROOTS = {"jaxfeed": "jaxfeed", "jaxfeed.loaders": "loaders", "jaxfeed.sharding": "sharding"}

setup(
    package_dir=ROOTS,
    packages=[
        name
        for package, folder in ROOTS.items()
        for name in (package, *(f"{package}.{sub}" for sub in find_packages(folder)))
    ],
)
