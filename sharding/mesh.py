"""Meshes and the batch sharding: batches split over a named ``data`` axis."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = "data"


def data_mesh(
    devices: Sequence[jax.Device] | None = None,
    *,
    data_axis: str = DATA_AXIS,
    model: int = 1,
    model_axis: str = "model",
) -> Mesh:
    """A mesh for data parallelism over ``devices`` (default: every device of every process).

    Devices are ordered by process, so process ``p``'s devices hold the
    ``p``-th contiguous block of each global batch. (``jax.make_mesh`` takes
    axis shapes and names instead; any `Mesh` works with `DeviceFeed`.)

    Args:
      devices: the devices to use.
      data_axis: name of the axis batches are split over.
      model: size of an optional second axis over which batches are
        replicated (for model parallelism); 1 gives a 1-D mesh.
      model_axis: that axis's name.

    Raises:
      ValueError: ``model`` does not divide the device count.

    Example:
      >>> mesh = data_mesh()            # 1-D: ('data',)
      >>> mesh = data_mesh(model=2)     # 2-D: ('data', 'model')
    """
    devices = list(jax.devices() if devices is None else devices)
    devices.sort(key=lambda d: (d.process_index, d.id))
    if model < 1 or len(devices) % model:
        raise ValueError(
            f"model axis size {model} does not divide the {len(devices)} devices; "
            f"pick a divisor of {len(devices)}"
        )
    if model == 1:
        return Mesh(np.array(devices), (data_axis,))
    return Mesh(np.array(devices).reshape(-1, model), (data_axis, model_axis))


def batch_sharding(
    mesh_or_sharding: Mesh | NamedSharding | None = None,
    *,
    data_axis: str = DATA_AXIS,
    argument: str = "mesh_or_sharding",
) -> NamedSharding:
    """The sharding of every batch leaf: leading axis over ``data_axis``,
    replicated over any other mesh axis.

    Args:
      mesh_or_sharding: a `Mesh` (its ``data_axis`` is used), a user's
        `NamedSharding` (returned as is), or None for ``data_mesh()``.
      data_axis: the mesh axis to split batches over.
      argument: the caller's name for ``mesh_or_sharding``, for its errors.

    Raises:
      TypeError: neither a `Mesh`, a `NamedSharding` nor None.
      ValueError: the mesh has no axis called ``data_axis``.
    """
    if isinstance(mesh_or_sharding, NamedSharding):
        return mesh_or_sharding
    if mesh_or_sharding is not None and not isinstance(mesh_or_sharding, Mesh):
        raise TypeError(
            f"{argument} must be a jax.sharding.Mesh, a NamedSharding or None (all devices), "
            f"got {mesh_or_sharding!r:.80} ({type(mesh_or_sharding).__name__})"
        )
    mesh = data_mesh(data_axis=data_axis) if mesh_or_sharding is None else mesh_or_sharding
    if data_axis not in mesh.axis_names:
        axis = mesh.axis_names[0]
        raise ValueError(
            f"mesh axis {data_axis!r} not found; the mesh has axes {mesh.axis_names}. "
            f"Pass the batch sharding instead of the mesh (DeviceFeed(source, sharding), "
            f"fit(..., mesh=sharding)) with sharding = NamedSharding(mesh, "
            f"PartitionSpec({axis!r})), or build the mesh with a {data_axis!r} axis: "
            f"Mesh(devices, ({data_axis!r},)) or jaxfeed.data_mesh()"
        )
    return NamedSharding(mesh, PartitionSpec(data_axis))


def data_axis_size(sharding: NamedSharding) -> int:
    """How many ways the leading (batch) axis is split."""
    axes = sharding.spec[0] if len(sharding.spec) else None
    if axes is None:
        return 1
    axes = axes if isinstance(axes, tuple) else (axes,)
    return int(np.prod([sharding.mesh.shape[a] for a in axes]))
