import os
import jaxfeed
from faulty_proxy import FaultyProxy
from test_object_storage import store  # noqa
from test_remote_parquet import varsplit, _var_url  # noqa
from test_remote_tfrecord import varshards  # noqa
from jaxfeed.loaders.data.encoded import augment


def _measure(port, url, kwargs, env, read, cache):
    env.setenv("JAXFEED_READ", read)
    env.setenv("JAXFEED_CACHE_BYTES", str(cache))
    with FaultyProxy(port, faults=()) as proxy:
        opts = {"client_kwargs": {"endpoint_url": proxy.url}}
        s0 = proxy.stats()
        source = jaxfeed.make("numpy", dataset=url, storage_options=opts, **kwargs)
        s1 = proxy.stats()
        n1 = sum(1 for _ in source.iter_epoch(0))
        s2 = proxy.stats()
        sum(1 for _ in source.iter_epoch(1))
        s3 = proxy.stats()
    return {
        "make": (s1["requests"] - s0["requests"], s1["sent"] - s0["sent"]),
        "epoch0": (s2["requests"] - s1["requests"], s2["sent"] - s1["sent"]),
        "epoch1": (s3["requests"] - s2["requests"], s3["sent"] - s2["sent"]),
        "batches": n1,
    }


def test_measure(varsplit, varshards, tmp_path):
    port = int(varsplit["endpoint"].rsplit(":", 1)[1])
    cases = [
        ("parquet img", _var_url("pq-img"), {"batch_size": 32, "shuffle": True, "transform": augment}),
        ("parquet tok pack", _var_url("pq-tok"), {"batch_size": 8, "shuffle": True, "pack": 64}),
        ("parquet tok pack blocks", _var_url("pq-tok"), {"batch_size": 8, "shuffle": "blocks", "pack": 64}),
        ("tfr img", varshards["urls"]["tfr-img/"], {"batch_size": 32, "shuffle": True, "transform": augment}),
        ("tfr tok pack", varshards["urls"]["tfr-tok/"], {"batch_size": 8, "shuffle": True, "pack": 64}),
        ("tfr tok pack blocks", varshards["urls"]["tfr-tok/"], {"batch_size": 8, "shuffle": "blocks", "pack": 64}),
    ]
    env = varshards["env"]
    for i, (name, url, kwargs) in enumerate(cases):
        env.setenv("JAXFEED_CACHE_DIR", str(tmp_path / f"c{i}"))
        ranged = _measure(port, url, kwargs, env, "ranges", 64_000)
        env.setenv("JAXFEED_CACHE_DIR", str(tmp_path / f"w{i}"))
        whole = _measure(port, url, kwargs, env, "whole", 1 << 30)
        print(f"\n{name}: in place {ranged}\n{name}: whole    {whole}")
