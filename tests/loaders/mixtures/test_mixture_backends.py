"""A `Mixture` gives byte-identical batches on every backend, with and without
worker processes, over two mixture epochs in which a small component comes
round several times; it resumes exactly, elastically, and with new weights."""

import itertools

import numpy as np
import pytest
from jaxfeed.loaders.mixture_plan import COMPONENT

import jaxfeed
from jaxfeed import loaders
from tests.backend_helpers import assert_same_batches

BIG, SMALL = 1000, 70  # the small one wraps ~5 times in two epochs


def _components() -> dict:
    big = {
        "x": np.arange(BIG, dtype=np.float32)[:, None].repeat(3, 1),
        "y": np.zeros(BIG, np.int32),
    }
    small = {
        "x": -np.arange(1, SMALL + 1, dtype=np.float32)[:, None].repeat(3, 1),
        "y": np.ones(SMALL, np.int32),
    }
    return {"web": big, "clean": small}


def noise(record, rng):
    """A random augmentation: the row's own generator decides it."""
    return {"x": record["x"] + rng.random(3, dtype=np.float32) / 2, "y": record["y"]}


def _mixture(by="row", weights=(0.7, 0.3), **kwargs) -> jaxfeed.Mixture:
    return jaxfeed.Mixture(
        _components(),
        weights=dict(zip(("web", "clean"), weights, strict=True)),
        by=by,
        epoch_rows=640,
        **kwargs,
    )


def _epochs(backend: str, by: str, **options) -> list[dict]:
    source = loaders.make(backend, dataset=_mixture(by), batch_size=32, seed=3, **options)
    try:
        return [*source.iter_epoch(0), *source.iter_epoch(1), *source.iter_epoch(1, start=7)]
    finally:
        source.close()


RUNS = [
    ("torch", {}),
    pytest.param("torch", {"num_workers": 2, "transform": noise}, marks=pytest.mark.slow),
    ("tf", {}),
    ("grain", {}),
    pytest.param("grain", {"num_workers": 2, "transform": noise}, marks=pytest.mark.slow),
    ("hf", {}),
    ("numpy", {"num_workers": 2, "transform": noise}),
]


@pytest.fixture(scope="module")
def reference() -> dict:
    return {
        (by, t): _epochs("numpy", by, **({"transform": noise} if t else {}))
        for by in ("row", "batch")
        for t in (False, True)
    }


@pytest.mark.parametrize(("backend", "options"), RUNS, ids=str)
def test_every_backend_gives_the_numpy_batches(backend, options, reference):
    for by in ("row", "batch"):
        assert_same_batches(_epochs(backend, by, **options), reference[by, "transform" in options])


def test_resumes_exactly_and_each_pass_holds_every_row_once(reference):
    for (by, _), batches in reference.items():
        assert len(batches) == 20 + 20 + 13
        assert_same_batches(batches[40:], batches[27:40])
        comp = np.concatenate([b[COMPONENT] for b in batches[:40]])
        x = np.concatenate([b["x"][:, 0] for b in batches[:40]])
        clean = -np.floor(x[comp == 1]).astype(int)  # the small one's rows (noise < 1/2)
        assert len(clean) == 384 if by == "row" else abs(len(clean) - 384) <= 1
        for start in range(0, len(clean) - SMALL + 1, SMALL):  # passes of its own
            assert sorted(clean[start : start + SMALL]) == list(range(1, SMALL + 1))
        web = np.floor(x[comp == 0]).astype(int)
        assert len(set(web.tolist())) == len(web)  # the big one not yet round once


def test_augmentation_is_new_each_time_a_row_comes_round(reference):
    batches = reference["row", True][:40]
    comp = np.concatenate([b[COMPONENT] for b in batches])
    x = np.concatenate([b["x"] for b in batches])[comp == 1]
    first_row = x[-np.floor(x[:, 0]) == 1]
    assert len(first_row) >= 4  # row 1 of the small one, in each pass
    assert len({tuple(r) for r in first_row.round(6).tolist()}) == len(first_row)


def test_batch_proportions_are_exact_per_batch(reference):
    for batch in reference["batch", False][:40]:
        clean = int((batch[COMPONENT] == 1).sum())
        assert clean in (9, 10)  # 0.3 * 32 = 9.6


def test_a_one_process_run_continues_on_two_processes(reference):
    want = reference["row", False][20:40]
    halves = [
        loaders.make(
            "numpy", dataset=_mixture(), batch_size=16, seed=3, process_index=i, process_count=2
        ).iter_epoch(1, start=5)
        for i in range(2)
    ]
    for (a, b), w in zip(zip(*halves, strict=True), want[5:], strict=True):
        assert_same_batches([{k: np.concatenate([a[k], b[k]]) for k in a}], [w])


def test_new_weights_at_a_resume_continue_every_component():
    first = loaders.make("numpy", dataset=_mixture(), batch_size=32, seed=3)
    part1 = list(first.iter_epoch(0))[:12]
    state = first.data_state(0, 12)
    assert state["mixture"]["phases"][0]["weights"] == pytest.approx([0.7, 0.3])
    same = loaders.make("numpy", dataset=_mixture(), batch_size=32, seed=3)
    same.restore_data_state(state)
    assert_same_batches(list(same.iter_epoch(0, start=12)), list(first.iter_epoch(0))[12:])

    other = loaders.make("numpy", dataset=_mixture(weights=(0.2, 0.8)), batch_size=32, seed=3)
    with pytest.raises(ValueError, match=r"reweight=True"):
        other.restore_data_state(state)
    moved = loaders.make(
        "numpy", dataset=_mixture(weights=(0.2, 0.8), reweight=True), batch_size=32, seed=3
    )
    moved.restore_data_state(state)
    part2 = list(moved.iter_epoch(0, start=12)) + list(moved.iter_epoch(1))
    assert [p["weights"] for p in moved.data_state(1, 3)["mixture"]["phases"]] == [
        pytest.approx([0.7, 0.3]),
        pytest.approx([0.2, 0.8]),
    ]
    comp = np.concatenate([b[COMPONENT] for b in part2])
    assert abs((comp == 1).mean() - 0.8) < 0.01
    # Each component's rows over both parts: its own stream, nothing repeated or skipped.
    batches = part1 + part2
    comp = np.concatenate([b[COMPONENT] for b in batches])
    x = np.concatenate([b["x"][:, 0] for b in batches])
    web = x[comp == 0].astype(int)
    assert len(set(web.tolist())) == len(web)
    clean = (-x[comp == 1]).astype(int)
    for start in range(0, len(clean) - SMALL + 1, SMALL):
        assert sorted(clean[start : start + SMALL]) == list(range(1, SMALL + 1))


def test_refusals_are_named():
    comps = _components()
    with pytest.raises(ValueError, match="epoch is ambiguous"):
        jaxfeed.Mixture(comps, weights={"web": 1, "clean": 1})
    with pytest.raises(ValueError, match="one weight per component"):
        jaxfeed.Mixture(comps, weights={"web": 1}, epoch_rows=10)
    with pytest.raises(ValueError, match="weights are numbers >= 0"):
        jaxfeed.Mixture(comps, weights={"web": -1, "clean": 1}, epoch_rows=10)
    with pytest.raises(ValueError, match="until='nope'"):
        jaxfeed.Mixture(comps, weights={"web": 1, "clean": 1}, until="nope")
    odd = dict(comps, clean={"x": comps["clean"]["x"][:, :2], "y": comps["clean"]["y"]})
    with pytest.raises(
        ValueError, match=r"components 'web' and 'clean' give other fields: \['x'\]"
    ):
        loaders.make("numpy", dataset=jaxfeed.Mixture(odd, {"web": 1, "clean": 1}, epoch_rows=64))
    taken = {k: dict(v, component=v["y"]) for k, v in comps.items()}
    with pytest.raises(ValueError, match="rename yours"):
        loaders.make("numpy", dataset=jaxfeed.Mixture(taken, {"web": 1, "clean": 1}, epoch_rows=64))
    source = loaders.make("numpy", dataset=_mixture(), batch_size=32)
    state = source.data_state(0, 3)
    fewer = jaxfeed.Mixture({"web": comps["web"]}, weights={"web": 1}, epoch_rows=640)
    with pytest.raises(ValueError, match="adding, removing, renaming or reordering components"):
        loaders.make("numpy", dataset=fewer, batch_size=32).restore_data_state(state)


def test_until_ends_the_epoch_with_the_named_component():
    mixture = jaxfeed.Mixture(_components(), weights={"web": 0.5, "clean": 0.5}, until="clean")
    source = loaders.make("numpy", dataset=mixture, batch_size=10)
    for epoch in range(2):
        comp = np.concatenate([b[COMPONENT] for b in source.iter_epoch(epoch)])
        assert (comp == 1).sum() == SMALL
    assert source.positions(2, 0) == {"web": 2 * (len(comp) - SMALL), "clean": 2 * SMALL}


def test_realized_weights_stay_within_sampling_noise():
    # by="row": batch k's share of a component is hypergeometric. Over a
    # window of 1,000 batches of 64 rows (64,000 rows), 5 standard deviations
    # of a binomial share (an upper bound of the hypergeometric's) is
    # 5 * sqrt(0.3 * 0.7 / 64000) = 0.0091: a false alarm once in ~3.5 million
    # windows, and the seed is fixed, so it cannot flake.
    mixture = jaxfeed.Mixture(
        _components(), weights={"web": 0.7, "clean": 0.3}, epoch_rows=64 * 5000
    )
    source = loaders.make("numpy", dataset=mixture, batch_size=64, seed=5)
    for window in (range(0, 1000), range(2000, 3000)):
        share = source.proportions(0, window)["clean"]
        assert abs(share - 0.3) < 5 * np.sqrt(0.3 * 0.7 / 64000), (window, share)
    comp = np.concatenate([b[COMPONENT] for b in itertools.islice(source.iter_epoch(0), 1000)])
    assert (comp == 1).mean() == pytest.approx(source.proportions(0, range(1000))["clean"])
