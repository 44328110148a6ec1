"""Subprocess body of tests/test_stream_resume.py: wrapped streams saved and resumed.

``python tests/stream_resume_worker.py save OUT.npz STATE.json KIND...``: for
each kind, reads epochs 0..E-1, then epoch E through a `DeviceFeed` (which
reads ahead) up to batch K, takes ``data_state(E, K)``, and reads on, without
a break, to the end of epoch E + 1. Writes the states (JSON) and every batch.

``python tests/stream_resume_worker.py resume OUT.npz STATE.json KIND...``: in
a fresh process, builds each kind again, restores its state and reads epoch
E from batch K, then epoch E + 1.

``python tests/stream_resume_worker.py fit OUT.npz CHECKPOINTS KILL_AT KIND...``:
trains a linear model with `jaxfeed.fit` on each kind for 3 epochs,
checkpointing every step and resuming from CHECKPOINTS/KIND if it holds a
checkpoint; KILL_AT > 0 sends SIGKILL to this process at that training step.
Writes the final parameters.
"""

import json
import os
import signal
import sys

import numpy as np

N = 100


def _rows():
    rng = np.random.default_rng(0)
    return {
        "x": rng.normal(size=(N, 3)).astype(np.float32),
        "label": np.arange(N, dtype=np.int32),
    }


def tf_shuffled():
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices(_rows()).shuffle(50, seed=0).batch(16)
    return {"obj": dataset.prefetch(2)}


def tf_filtered():  # unknown length: passes end at a marker
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices(_rows()).shuffle(40, seed=2)
    return {"obj": dataset.filter(lambda row: row["label"] % 3 > 0).batch(16)}


def tf_steps():  # endless: one live iterator, epochs of steps_per_epoch
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices(_rows()).shuffle(30, seed=1).repeat()
    return {"obj": dataset.batch(8), "steps_per_epoch": 5}


def _jitter(row, rng):
    return {"x": row["x"] + np.float32(rng.random()), "label": row["label"]}


def _grain_records():
    import grain

    rows = _rows()
    return grain.MapDataset.range(N).map(lambda i: {k: v[i] for k, v in rows.items()})


def grain_iter():  # Grain iterates it the same way every time: epochs are equal
    stream = _grain_records().shuffle(seed=3).random_map(_jitter, seed=5).to_iter_dataset()
    return {"obj": stream.batch(16)}


def grain_steps():  # endless, reshuffled per pass of .repeat(): epochs of steps_per_epoch
    stream = _grain_records().shuffle(seed=3).repeat().random_map(_jitter, seed=5)
    return {"obj": stream.to_iter_dataset().batch(16), "steps_per_epoch": 5}


def hf_shuffled():  # the case: a shuffle buffer, which HF's state_dict leaves out
    import datasets

    table = datasets.Dataset.from_dict(_rows())
    stream = table.to_iterable_dataset(num_shards=4).shuffle(seed=1, buffer_size=10)
    return {"obj": stream, "batch_size": 16}


def hf_sharded():  # no buffer: HF's own state_dict, taken after every batch
    import datasets

    return {"obj": datasets.Dataset.from_dict(_rows()).to_iterable_dataset(num_shards=4),
            "batch_size": 16}  # fmt: skip


def torch_iterable():  # its order drawn from torch's global generator, no set_epoch
    import torch

    class Rows(torch.utils.data.IterableDataset):
        def __init__(self):
            self.rows = _rows()

        def __iter__(self):
            for i in torch.randperm(N).tolist():
                yield {k: v[i] for k, v in self.rows.items()}

    torch.manual_seed(0)
    return {"obj": torch.utils.data.DataLoader(Rows(), batch_size=16, num_workers=0)}


def torch_sampler():  # a sampler of its own, drawing from its own generator
    import torch

    class Rows(torch.utils.data.Dataset):
        def __init__(self):
            self.rows = _rows()

        def __len__(self):
            return N

        def __getitem__(self, i):
            return {k: v[i] for k, v in self.rows.items()}

    order = torch.utils.data.SubsetRandomSampler(
        range(N), generator=torch.Generator().manual_seed(7)
    )
    return {"obj": torch.utils.data.DataLoader(Rows(), batch_size=16, sampler=order)}


# --- mixtures a user built with their framework's own tool (issue 44) ----------------------
# Two sources told apart by their labels: "web" 0..139 and "code" 1000..1059, mixed
# 0.7 : 0.3 (jaxfeed's own spelling is jaxfeed.Mixture, in jaxfeed.make).
WEIGHTS = (0.7, 0.3)


def _part(name):
    rng = np.random.default_rng(len(name))
    first, count = {"web": (0, 140), "code": (1000, 60)}[name]
    return {
        "x": rng.normal(size=(count, 3)).astype(np.float32),
        "label": np.arange(first, first + count, dtype=np.int32),
    }


def _grain_part(name, seed):
    import grain

    part = _part(name)
    rows = grain.MapDataset.range(len(part["label"])).map(
        lambda i: {k: v[i] for k, v in part.items()}
    )
    return rows.shuffle(seed=seed)


def grain_mix_map():  # random access: read in the shared sampler's order
    import grain

    mixed = grain.MapDataset.mix([_grain_part("web", 1), _grain_part("code", 2)], list(WEIGHTS))
    return {"obj": mixed.batch(16), "seed": 4}


def grain_mix_iter():  # a stream: Grain's iterator state
    import grain

    parts = [_grain_part("web", 1).to_iter_dataset(), _grain_part("code", 2).to_iter_dataset()]
    return {"obj": grain.IterDataset.mix(parts, list(WEIGHTS)).batch(16)}


def hf_interleave(seed=0):  # a stream: HF's state_dict holds the sampling generator's state
    import datasets

    parts = [datasets.Dataset.from_dict(_part(n)).to_iterable_dataset(2) for n in ("web", "code")]
    mixed = datasets.interleave_datasets(parts, probabilities=list(WEIGHTS), seed=seed)
    return {"obj": mixed, "batch_size": 16}


def hf_interleave_unseeded():  # epoch 0 draws from the OS; later ones from the epoch number
    return hf_interleave(seed=None)


def hf_interleave_table():  # a datasets.Dataset: random access
    import datasets

    parts = [datasets.Dataset.from_dict(_part(n)) for n in ("web", "code")]
    mixed = datasets.interleave_datasets(parts, probabilities=list(WEIGHTS), seed=0)
    return {"obj": mixed, "batch_size": 16, "seed": 4}


def _tf_part(name, seed):
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(_part(name)).shuffle(60, seed=seed)


def tf_sample():  # tf.data's checkpoint holds the sampling state
    import tensorflow as tf

    parts = [_tf_part("web", 1), _tf_part("code", 2)]
    return {"obj": tf.data.Dataset.sample_from_datasets(parts, list(WEIGHTS), seed=0).batch(16)}


def tf_choose():  # a seeded random choice of source, 7 in 10 "web"
    import tensorflow as tf

    choice = tf.data.Dataset.random(seed=3).map(lambda x: tf.cast(x % 10 >= 7, tf.int64))
    parts = [_tf_part("web", 1), _tf_part("code", 2)]
    return {"obj": tf.data.Dataset.choose_from_datasets(parts, choice).batch(16)}


def _torch_concat():
    import torch

    class Rows(torch.utils.data.Dataset):
        def __init__(self, name):
            self.rows = _part(name)

        def __len__(self):
            return len(self.rows["label"])

        def __getitem__(self, i):
            return {k: v[i] for k, v in self.rows.items()}

    return torch.utils.data.ConcatDataset([Rows("web"), Rows("code")])


def _weighted(generator):
    import torch

    both = _torch_concat()
    sizes = [len(d) for d in both.datasets]
    weights = torch.cat([torch.full((n,), w / n) for n, w in zip(sizes, WEIGHTS, strict=True)])
    sampler = torch.utils.data.WeightedRandomSampler(weights, 200, generator=generator)
    return {"obj": torch.utils.data.DataLoader(both, batch_size=16, sampler=sampler)}


def torch_weighted():  # its own generator, seeded
    import torch

    return _weighted(torch.Generator().manual_seed(5))


def torch_weighted_global():  # no generator: it draws from torch's global one
    return _weighted(None)


def torch_concat():  # shuffle=True: random access, read in the shared sampler's order
    import torch

    loader = torch.utils.data.DataLoader(_torch_concat(), batch_size=16, shuffle=True)
    return {"obj": loader, "seed": 4}


# kind -> (builder, epoch E, batch K)
MIXTURES = {
    "grain-mix-map": (grain_mix_map, 1, 3),
    "grain-mix-iter": (grain_mix_iter, 1, 3),
    "hf-interleave": (hf_interleave, 1, 3),
    "hf-interleave-unseeded": (hf_interleave_unseeded, 0, 3),
    "hf-interleave-table": (hf_interleave_table, 1, 3),
    "tf-sample": (tf_sample, 1, 3),
    "tf-choose": (tf_choose, 1, 3),
    "torch-weighted": (torch_weighted, 1, 3),
    "torch-weighted-global": (torch_weighted_global, 1, 3),
    "torch-concat": (torch_concat, 1, 3),
}

# kind -> (builder, epoch E, batch K)
KINDS = {
    "tf": (tf_shuffled, 1, 3),
    "tf-filter": (tf_filtered, 1, 2),
    "tf-steps": (tf_steps, 2, 3),
    "grain": (grain_iter, 1, 3),
    "grain-steps": (grain_steps, 2, 2),
    "hf": (hf_shuffled, 3, 3),
    "hf-sharded": (hf_sharded, 1, 2),
    "torch": (torch_iterable, 2, 3),
    "torch-sampler": (torch_sampler, 2, 4),
}
EVERY = {**KINDS, **MIXTURES}


def _source(kind):
    from jaxfeed import loaders

    options = EVERY[kind][0]()
    return loaders.wrap(options.pop("obj"), **options)


def _save(kind):
    from jaxfeed.sharding import DeviceFeed

    source = _source(kind)
    _, epoch, k = EVERY[kind]
    out = {}
    for e in range(epoch):
        out[e] = list(source.iter_epoch(e))
    with DeviceFeed(source, epoch=epoch) as feed:
        batches = [next(feed) for _ in range(k)]
        state = source.data_state(epoch, k)  # the feed has read ahead of batch k
        batches += list(feed)
    out[epoch] = [{key: np.asarray(v) for key, v in b.items()} for b in batches]
    out[epoch + 1] = list(source.iter_epoch(epoch + 1))
    return json.loads(json.dumps(state)), out


def _resume(kind, state):
    source = _source(kind)
    _, epoch, k = EVERY[kind]
    source.restore_data_state(state)
    resumed = list(source.iter_epoch(epoch, start=k))
    return {epoch: resumed, epoch + 1: list(source.iter_epoch(epoch + 1))}


def _flat(kind, batches_by_epoch):
    return {
        f"{kind}|{epoch}|{i}|{key}": value
        for epoch, batches in batches_by_epoch.items()
        for i, batch in enumerate(batches)
        for key, value in batch.items()
    }


def _fit(kind, directory, kill_at):
    import jax
    import jax.numpy as jnp
    import optax

    from jaxfeed import Checkpointing, Logging, batch_mask, fit

    tx = optax.sgd(0.05, momentum=0.9)

    def kill(step):
        if int(step) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def step(state, batch):
        def loss(params):
            error = batch["x"] @ params["w"] + params["b"] - batch["label"] / N
            mask = batch_mask(batch)
            total = jnp.sum(error**2 * mask)
            return total / jnp.maximum(jnp.sum(mask), 1.0), {"loss": total, "count": jnp.sum(mask)}

        grads, sums = jax.grad(loss, has_aux=True)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"])
        if kill_at:
            jax.debug.callback(kill, state["t"] + 1)  # dies during training step KILL_AT
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "opt_state": opt_state, "t": state["t"] + 1}, sums

    params = {"w": jnp.zeros((3,)), "b": jnp.zeros(())}
    state = {"params": params, "opt_state": tx.init(params), "t": jnp.zeros((), jnp.int32)}
    result = fit(
        step,
        state,
        _source(kind),
        epochs=3,
        checkpoint=Checkpointing(os.path.join(directory, kind), every=1),
        resume=True,
        log=Logging(progress=False),
    )
    return {f"{kind}|{k}": np.asarray(v) for k, v in result.state["params"].items()}


def main(mode, out_path, state_path, kinds):
    arrays = {}
    if mode == "fit":
        kill_at, *kinds = kinds
        for kind in kinds:
            arrays.update(_fit(kind, state_path, int(kill_at)))
    elif mode == "save":
        states = {}
        for kind in kinds:
            states[kind], batches = _save(kind)
            arrays.update(_flat(kind, batches))
        with open(state_path, "w") as file:
            json.dump(states, file)
    else:
        with open(state_path) as file:
            states = json.load(file)
        for kind in kinds:
            arrays.update(_flat(kind, _resume(kind, states[kind])))
    np.savez(out_path, **arrays)


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
