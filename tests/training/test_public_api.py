"""The public names are pinned, one import root serves them all, importing stays light,
and the layout keeps its rules: no import circle, no private name used across modules."""

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import jaxfeed
from jaxfeed import loaders, sharding

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "jaxfeed": ROOT / "jaxfeed",
    "jaxfeed.loaders": ROOT / "loaders",
    "jaxfeed.sharding": ROOT / "sharding",
}

LOADERS = [
    "BACKENDS",
    "DATASETS",
    "MASK_KEY",
    "ArrayDataset",
    "ArraySpec",
    "Batch",
    "BatchSource",
    "Bucket",
    "BytesField",
    "HostFields",
    "Mixture",
    "Pack",
    "Pad",
    "ProcessSlice",
    "RaggedField",
    "Resumable",
    "Sampler",
    "SkipsDataState",
    "TransformError",
    "available",
    "load_dataset",
    "make",
    "wrap",
]
SHARDING = [
    "DATA_AXIS",
    "DeviceFeed",
    "announce_failure",
    "batch_sharding",
    "check_agreement",
    "data_mesh",
    "initialize",
    "place_batch",
]
LIBRARY = [
    "Callback",
    "CheckpointError",
    "Checkpointing",
    "FitResult",
    "Logging",
    "NonFiniteMetric",
    "Preempted",
    "TopologyChangedWarning",
    "batch_mask",
    "evaluate_metrics",
    "fit",
    "keras_data",
]


def test_public_names():
    assert sorted(loaders.__all__) == sorted(LOADERS)
    assert sorted(sharding.__all__) == sorted(SHARDING)
    assert sorted(jaxfeed.__all__) == sorted(LOADERS + SHARDING + LIBRARY)
    assert sorted(jaxfeed.mnist.__all__) == sorted(
        ["LAYER_SIZES", "TrainConfig", "evaluate", "init_params", "predict", "train"]
    )
    assert sorted(jaxfeed.nnx.__all__) == ["eval_step", "metric_sums", "step"]
    assert sorted(jaxfeed.textlm.__all__) == [
        "ModelConfig",
        "TrainConfig",
        "TransformerLM",
        "attention_mask",
        "load_corpus",
        "loss_sums",
        "train",
    ]
    for module in (loaders, sharding, jaxfeed, jaxfeed.mnist, jaxfeed.nnx, jaxfeed.textlm):
        for name in module.__all__:
            assert hasattr(module, name), name


def test_one_object_per_public_name():
    # jaxfeed.make is loaders.make, not a copy; and the example stays out of the library.
    for name in LOADERS:
        assert getattr(jaxfeed, name) is getattr(loaders, name), name
    for name in SHARDING:
        assert getattr(jaxfeed, name) is getattr(sharding, name), name
    assert callable(jaxfeed.fit) and not hasattr(jaxfeed, "TrainConfig")
    with pytest.raises(AttributeError, match="no attribute 'train'"):
        getattr(jaxfeed, "train")  # noqa: B009


@pytest.mark.parametrize(
    ("imports", "forbidden"),
    [
        # loaders imports not even jax until a backend or the feed needs it.
        (
            "jaxfeed.loaders; jaxfeed.loaders.make('numpy', dataset='mnist-sample', batch_size=8)",
            "jax",
        ),
        ("jaxfeed, jaxfeed.cli; jaxfeed.fit; jaxfeed.DeviceFeed", "matplotlib"),
        # jaxfeed.nnx imports Flax when a step is traced, not before.
        ("jaxfeed; jaxfeed.nnx.step(print); jaxfeed.nnx.metric_sums", "flax"),
        # keras_data imports Keras when it is called, not before.
        ("jaxfeed; jaxfeed.keras_data", "keras"),
        # The text example imports tokenizers when load_corpus trains one, not before.
        ("jaxfeed.textlm", "tokenizers"),
    ],
)
def test_importing_the_packages_imports_no_framework(imports, forbidden):
    code = (
        f"import sys, {imports}; "
        f"heavy = {{'torch', 'tensorflow', 'grain', 'datasets', {forbidden!r}}}; "
        "heavy &= set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_users_own_loaders_and_sharding_modules_do_not_shadow_jaxfeed(tmp_path):
    # A training repo's own loaders.py / sharding.py, first on sys.path.
    (tmp_path / "loaders.py").write_text("MINE = True\n")
    (tmp_path / "sharding.py").write_text("MINE = True\n")
    (tmp_path / "train.py").write_text(
        textwrap.dedent(
            """
            import loaders, sharding
            import jax, jax.numpy as jnp
            import jaxfeed
            assert loaders.MINE and sharding.MINE

            def loss(w, batch):
                x = batch["image"].reshape(-1, 784) / 255.0
                weight = jaxfeed.batch_mask(batch)
                return jnp.sum(weight * (x @ w - batch["label"]) ** 2), jnp.sum(weight)

            def step(w, batch):
                (total, count), grad = jax.value_and_grad(loss, has_aux=True)(w, batch)
                return w - 1e-6 * grad, {"loss": total, "count": count}

            source = jaxfeed.make("numpy", dataset="mnist-sample", batch_size=200)
            quiet = jaxfeed.Logging(progress=False)
            result = jaxfeed.fit(step, jnp.zeros(784), source, epochs=2, log=quiet)
            print("trained", [round(r["loss"], 3) for r in result.history])
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    first, last = eval(done.stdout.split("trained", 1)[1])
    assert last < first


def _modules() -> dict[str, Path]:
    """Every module of the three packages, by its installed dotted name."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def _imports(path: Path, name: str) -> list[tuple[str, str | None]]:
    """(module, imported name or None) for each of a module's own jaxfeed imports."""
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(alias.name, None) for alias in node.names]
    return [(m, n) for m, n in out if m.split(".")[0] == "jaxfeed"]


def test_no_import_circle():
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        edges = set()
        for module, imported in _imports(path, name):
            target = f"{module}.{imported}" if f"{module}.{imported}" in modules else module
            # A package's own __init__ re-exports its modules: not an edge into them.
            if target in modules and target != name and not name.startswith(target + "."):
                edges.add(target)
        graph[name] = edges

    def cycle_from(start):
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    return path
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
        return None

    circles = {tuple(c) for n in graph if (c := cycle_from(n)) and len(c) > 1}
    # A package __init__ that imports its modules is not a circle of modules.
    circles = {c for c in circles if not all(m in PACKAGES or "." not in m for m in c)}
    assert not circles, sorted(circles)[:5]


def test_no_private_name_is_imported_from_another_module():
    found = [
        f"{name} imports {module}.{imported}"
        for name, path in _modules().items()
        for module, imported in _imports(path, name)
        if imported and imported.startswith("_")
    ]
    for path in [*ROOT.joinpath("benchmarks").glob("*.py"), *ROOT.joinpath("tests").glob("*.py")]:
        found += [
            f"{path.name} imports {m}.{n}"
            for m, n in _imports(path, path.stem)
            if n and n.startswith("_")
        ]
    assert not found, found


def test_builtin_sources_satisfy_the_protocol():
    source = loaders.make("numpy", dataset="mnist-sample", batch_size=8)
    assert isinstance(source, loaders.BatchSource)
    assert isinstance(source, loaders.ProcessSlice) and not isinstance(source, loaders.Resumable)


def test_missing_package_names_what_to_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "grain" else real(name, *a)
    )
    with pytest.raises(ImportError, match=r"needs the package 'grain'.*jaxfeed\[grain\]"):
        loaders.make("grain", dataset="mnist-sample")
    assert loaders.available()["grain"] == 'unavailable: pip install "jaxfeed[grain]"'


def test_each_library_name_lives_in_the_module_the_table_names():
    # jaxfeed/__init__.py's name -> module table: the module that defines the name.
    homes = {name: getattr(jaxfeed, name).__module__ for name in LIBRARY}
    assert homes == {
        "Callback": "jaxfeed.training.callbacks",
        "CheckpointError": "jaxfeed.training.checkpoint",
        "Checkpointing": "jaxfeed.training.checkpoint",
        "FitResult": "jaxfeed.training.loop",
        "Logging": "jaxfeed.training.log",
        "NonFiniteMetric": "jaxfeed.training.run",
        "Preempted": "jaxfeed.training.interrupts",
        "TopologyChangedWarning": "jaxfeed.training.checkpoint",
        "batch_mask": "jaxfeed.training.steps",
        "evaluate_metrics": "jaxfeed.training.steps",
        "fit": "jaxfeed.training.loop",
        "keras_data": "jaxfeed.keras",
    }
