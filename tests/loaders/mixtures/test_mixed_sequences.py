"""A `Mixture` of token corpora, packed (or padded, bucketed): byte-identical
batches on every backend, whole rows in mixture proportions, each component's
passes whole, exact and elastic resume, and the refusals by name."""

import numpy as np
import pytest
from jaxfeed.loaders.mixture_plan import COMPONENT

import jaxfeed
from jaxfeed import loaders
from tests.backend_helpers import assert_same_batches

WEB, CODE = 300, 40  # rows; code comes round several times an epoch
CODE_MARK = 10000
CODE_CLIP = 30  # code's rows cut to this by its transform


def _corpus(rows: int, mark: int, seed: int) -> dict:
    """Rows of 1..60 tokens, every token of row ``r`` ``mark + r + 1``: a
    batch shows which row each token came from."""
    lengths = np.random.default_rng(seed).integers(1, 61, rows)
    return {"input_ids": [np.full(n, mark + r + 1, np.uint16) for r, n in enumerate(lengths)]}


def clipped(record, rng):
    """Code's own transform: runs once, before the plan, and decides the
    lengths (as a tokenizer's max_length would)."""
    return {"input_ids": record["input_ids"][:CODE_CLIP]}


def _mixture(weights=(0.5, 0.5), **kwargs) -> jaxfeed.Mixture:
    return jaxfeed.Mixture(
        {"web": _corpus(WEB, 0, 1), "code": _corpus(CODE, CODE_MARK, 2)},
        weights=dict(zip(("web", "code"), weights, strict=True)),
        until="web",
        transforms={"code": clipped},
        **kwargs,
    )


def _source(backend="numpy", layout=None, **options):
    options = {"batch_size": 8, **(layout or {"pack": 96}), **options}
    return loaders.make(backend, dataset=_mixture(), seed=5, **options)


def _epochs(backend: str, layout=None, **options) -> list[dict]:
    source = _source(backend, layout, **options)
    try:
        return [*source.iter_epoch(0), *source.iter_epoch(1), *source.iter_epoch(1, start=5)]
    finally:
        source.close()


@pytest.fixture(scope="module")
def reference() -> list[dict]:
    return _epochs("numpy")


RUNS = [
    ("torch", {}),
    ("tf", {}),
    ("grain", {}),
    pytest.param("grain", {"num_workers": 2}, marks=pytest.mark.slow),
    ("hf", {}),
]


@pytest.mark.parametrize(("backend", "options"), RUNS, ids=str)
def test_every_backend_gives_the_numpy_batches(backend, options, reference):
    assert_same_batches(_epochs(backend, **options), reference)


def test_an_epoch_holds_whole_rows_in_the_mixtures_proportions():
    source = _source()
    n0 = source.batches_in(0)
    batches = list(source.iter_epoch(0))
    resumed = list(source.iter_epoch(0, start=3))
    source.close()
    assert_same_batches(resumed, batches[3:])
    tokens = np.concatenate([b["input_ids"].reshape(-1) for b in batches])
    component = np.concatenate([b[COMPONENT].reshape(-1) for b in batches])
    segments = np.concatenate([b["segment_ids"].reshape(-1) for b in batches])
    real = segments > 0
    assert len(batches) == n0 and component.dtype == np.int32
    assert np.array_equal(component[real], (tokens[real] > CODE_MARK).astype(np.int32))
    marks, counts = np.unique(tokens[real], return_counts=True)
    web_lengths = np.array([len(r) for r in _corpus(WEB, 0, 1)["input_ids"]])
    code_lengths = np.array(
        [min(len(r), CODE_CLIP) for r in _corpus(CODE, CODE_MARK, 2)["input_ids"]]
    )
    web = marks <= WEB
    # until="web": every web row exactly once, whole.
    assert np.array_equal(marks[web], np.arange(1, WEB + 1))
    assert np.array_equal(counts[web], web_lengths)
    # Code's rows: as many as web's (weights 0.5/0.5), its passes whole (each
    # row seen k or k + 1 times), each row whole every time, as its transform cut it.
    seen, rest = np.divmod(counts[~web], code_lengths[marks[~web] - CODE_MARK - 1])
    assert not rest.any() and seen.max() - seen.min() <= 1
    assert abs(int(seen.sum()) - WEB) <= 8  # the epoch's rows are rounded to whole batches


def test_two_processes_read_the_halves_of_one_processs_batches():
    halves = [
        list(_source(batch_size=4, process_index=p, process_count=2).iter_epoch(1))
        for p in range(2)
    ]
    single = list(_source().iter_epoch(1))
    assert len(single) == len(halves[0]) == len(halves[1])
    for k, batch in enumerate(single):
        for key, value in batch.items():
            got = np.concatenate([halves[0][k][key], halves[1][k][key]])
            assert np.array_equal(got, value), (k, key)


def test_bucketed_and_padded_mixtures_carry_the_component_per_row():
    for layout in ({"bucket": (16, 32, 64)}, {"pad": 64}):
        torch_batches = _epochs("torch", layout)
        numpy_batches = _epochs("numpy", layout)
        assert_same_batches(torch_batches, numpy_batches)
        batch = numpy_batches[0]
        first = batch["input_ids"][:, 0]
        assert batch[COMPONENT].shape == (8,)
        assert np.array_equal(batch[COMPONENT], (first > CODE_MARK).astype(np.int32))


def test_a_resume_with_other_weights_or_reweight_is_refused():
    source = _source()
    state = source.data_state(1, 4)
    source.restore_data_state(state)  # its own: taken
    other = loaders.make("numpy", dataset=_mixture((0.8, 0.2)), batch_size=8, seed=5, pack=96)
    with pytest.raises(ValueError, match="resumes with the same components and weights"):
        other.restore_data_state(state)
    with pytest.raises(ValueError, match="reweight=True is for fixed-length rows"):
        loaders.make("numpy", dataset=_mixture(reweight=True), batch_size=8, pack=96)


def test_components_of_other_fields_or_dtypes_are_refused_by_name():
    web = _corpus(WEB, 0, 1)
    wide = {"input_ids": [r.astype(np.int32) for r in _corpus(CODE, CODE_MARK, 2)["input_ids"]]}
    mixture = jaxfeed.Mixture(
        {"web": web, "code": wide}, weights={"web": 1, "code": 1}, until="web"
    )
    with pytest.raises(ValueError, match="'web' and 'code' give other fields"):
        loaders.make("numpy", dataset=mixture, batch_size=8, pack=96)
    fixed = {"input_ids": np.zeros((10, 4), np.uint16)}
    mixture = jaxfeed.Mixture(
        {"web": web, "code": fixed}, weights={"web": 1, "code": 1}, until="web"
    )
    with pytest.raises(ValueError, match=r"component 'code'.*no field of rows of different"):
        loaders.make("numpy", dataset=mixture, batch_size=8, pack=96)
