"""Each row's generator, built a batch at a time, is numpy's
``default_rng((seed, epoch, row))``: the same state, so the same stream, on
any seed, epoch and row (checkpoints and committed hashes depend on it); and
the checks of a transform's records, made on the stacked batch, still name
the first row at fault."""

import pickle

import numpy as np
import pytest
from jaxfeed.loaders import ArrayDataset
from jaxfeed.loaders.row_generators import RowSeed, row_generators
from jaxfeed.loaders.transform import RecordTransform, TransformError

SEEDS = [0, 1, 12345, 2**31, 2**32 - 1]
EPOCHS = [0, 1, 9, 2**32 - 1]


def _rows() -> np.ndarray:
    """Rows of one and of two 32-bit words, with the edges between them."""
    rng = np.random.default_rng(0)
    edges = [0, 1, 2**32 - 1, 2**32, 2**32 + 1, 2**63 - 1]
    small = rng.integers(0, 2**32, 600)
    huge = rng.integers(2**32, 2**63 - 1, 100)
    return rng.permutation(np.concatenate([edges, small, huge]).astype(np.int64))


@pytest.mark.parametrize("seed", SEEDS)
def test_every_rows_generator_is_default_rng_of_seed_epoch_row(seed):
    rows = _rows()
    for epoch in EPOCHS:
        for row, rng in zip(rows.tolist(), row_generators(seed, epoch, rows), strict=True):
            expected = np.random.default_rng((seed, epoch, row))
            assert rng.bit_generator.state == expected.bit_generator.state, (seed, epoch, row)
    # The state is the whole stream; draws of several kinds, to be plain about it.
    for row, rng in zip(rows[:50].tolist(), row_generators(seed, 3, rows[:50]), strict=True):
        expected = np.random.default_rng((seed, 3, row))
        assert rng.random(3).tolist() == expected.random(3).tolist()
        assert rng.integers(0, 2**40, 3).tolist() == expected.integers(0, 2**40, 3).tolist()


def test_seeds_and_epochs_of_several_words_too():
    rows = np.array([0, 5, 2**32 + 5])
    for seed, epoch in [(2**64 + 3, 0), (7, 2**100), (2**200, 2**33)]:
        for row, rng in zip(rows.tolist(), row_generators(seed, epoch, rows), strict=True):
            expected = np.random.default_rng((seed, epoch, row))
            assert rng.bit_generator.state == expected.bit_generator.state


def test_its_seed_sequence_answers_as_numpys_does():
    (rng,) = row_generators(4, 2, np.array([77]))
    expected = np.random.default_rng((4, 2, 77))
    seq, real = rng.bit_generator.seed_seq, expected.bit_generator.seed_seq
    assert isinstance(seq, RowSeed) and seq.entropy == real.entropy == (4, 2, 77)
    assert seq.pool.tolist() == real.pool.tolist() and seq.spawn_key == ()
    assert seq.generate_state(3).tolist() == real.generate_state(3).tolist()
    children, expected_children = rng.spawn(2), expected.spawn(2)
    assert [c.random() for c in children] == [c.random() for c in expected_children]
    assert seq.n_children_spawned == 2
    rng.random(5), expected.random(5)
    again = pickle.loads(pickle.dumps(rng))  # a pickled rng goes on with the same stream
    assert again.random(4).tolist() == expected.random(4).tolist()


def _transform(fn) -> RecordTransform:
    return RecordTransform(fn, 0, ArrayDataset("rows", {"row": np.arange(12)}))


def _batch(transform: RecordTransform, rows: list[int]) -> dict:
    indices = np.array(rows)
    return transform.batch({"row": indices}, indices, 0)


def _wrong_on(bad: dict[int, object]):
    def fn(record, rng):
        return {"x": bad.get(int(record["row"]), np.zeros(2, np.float32)), "y": np.int32(1)}

    return fn


def test_a_record_of_strings_in_a_batch_is_named_by_row_and_field():
    transform = _transform(_wrong_on({6: "text"}))
    with pytest.raises(TransformError, match=r"field 'x' of kind 'U' for row 6 \(epoch 0\)"):
        _batch(transform, [3, 4, 5, 6, 7])


def test_an_object_record_in_a_batch_is_named_by_row():
    transform = _transform(_wrong_on({4: None}))
    with pytest.raises(TransformError, match=r"field 'x' of kind 'O' for row 4"):
        _batch(transform, [2, 4, 6])


def test_the_first_row_at_fault_is_named_as_row_by_row_checks_did():
    # Row 5's shape is wrong, row 7's kind is wrong, row 9 fails in fn: row 5 comes first.
    wrong = _wrong_on({5: np.zeros(3), 7: "text"})

    def fn(record, rng):
        if int(record["row"]) == 9:
            raise KeyError("nine")
        return wrong(record, rng)

    transform = _transform(fn)
    with pytest.raises(TransformError, match=r"field 'x' of shape \(3,\) for row 5"):
        _batch(transform, [4, 5, 7, 9])
    with pytest.raises(TransformError, match=r"kind 'U' for row 7"):
        _batch(transform, [4, 7, 9])
    with pytest.raises(TransformError, match=r"failed on row 9 \(epoch 0\): KeyError"):
        _batch(transform, [4, 9, 5])


def test_other_fields_and_integers_that_do_not_fit_are_still_refused():
    def extra_field(record, rng):
        out = {"x": np.zeros(2, np.float32), "y": np.int32(1)}
        if int(record["row"]) == 3:
            out["z"] = 1
        return out

    with pytest.raises(TransformError, match=r"fields \['x', 'y', 'z'\] for row 3"):
        _batch(_transform(extra_field), [1, 2, 3])

    def big_y(record, rng):
        return {"x": np.zeros(2, np.float32), "y": np.int64(2**40 if record["row"] == 2 else 1)}

    with pytest.raises(TransformError, match=r"field 'y' holds 1..1099511627776, outside"):
        _batch(_transform(big_y), [1, 2, 3])


def test_a_batch_is_what_row_by_row_calls_give():
    def fn(record, rng):
        return {"x": rng.random(2).astype(np.float32), "y": np.int32(rng.integers(100))}

    transform = _transform(fn)
    rows = [11, 0, 4, 4]
    batch = _batch(transform, rows)
    for j, row in enumerate(rows):
        expected = fn(None, np.random.default_rng((0, 0, row)))
        assert batch["x"][j].tobytes() == expected["x"].tobytes() and batch["y"][j] == expected["y"]
    assert batch["x"].dtype == np.float32 and batch["y"].dtype == np.int32


def test_a_batchs_generators_are_made_together_and_each_its_own():
    rows = np.array([3, 3, 2**40])
    generators = row_generators(1, 2, rows)
    assert isinstance(generators, list) and len({id(g) for g in generators}) == 3
    first = generators[0].random(2)  # one row's draws leave the next row's stream alone
    assert generators[1].random(2).tolist() == first.tolist()
    assert (
        generators[2].bit_generator.state
        == np.random.default_rng((1, 2, 2**40)).bit_generator.state
    )


def test_fields_of_other_names_but_as_many_are_named_by_row():
    # Row 0's fields are x and y; row 6 returns x and z: as many, so only the stack sees it.
    def renamed(record, rng):
        out = {"x": np.zeros(2, np.float32), "y": np.int32(1)}
        if int(record["row"]) == 6:
            out["z"] = out.pop("y")
        return out

    with pytest.raises(TransformError, match=r"fields \['x', 'z'\] for row 6 \(epoch 0\)"):
        _batch(_transform(renamed), [2, 6, 7])
    # An earlier row's wrong shape still comes first.
    wrong = _wrong_on({2: np.zeros(3)})

    def both(record, rng):
        return renamed(record, rng) if int(record["row"]) == 6 else wrong(record, rng)

    with pytest.raises(TransformError, match=r"field 'x' of shape \(3,\) for row 2"):
        _batch(_transform(both), [1, 2, 6])


def test_a_record_that_is_a_mapping_but_not_a_dict_is_batched():
    from types import MappingProxyType

    def proxy(record, rng):
        return MappingProxyType({"x": rng.random(2).astype(np.float32), "y": np.int32(1)})

    batch = _batch(_transform(proxy), [4, 0])
    expected = np.random.default_rng((0, 0, 4)).random(2).astype(np.float32)
    assert batch["x"][0].tobytes() == expected.tobytes() and batch["y"].tolist() == [1, 1]

    def list_on_3(record, rng):
        return [1] if int(record["row"]) == 3 else proxy(record, rng)

    with pytest.raises(TransformError, match=r"returned list for row 3; it must return a dict"):
        _batch(_transform(list_on_3), [1, 3])
