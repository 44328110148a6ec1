"""Datasets that augment the way hand-written code does, drawing from global
generators; at module level so spawned DataLoader workers can import them."""

import random

import numpy as np
import torch


class GlobalRandomDataset(torch.utils.data.Dataset):
    """Row ``i`` plus noise from numpy's global generator and from Python's
    ``random``: albumentations-style augmentation."""

    def __init__(self, rows: int = 64):
        self.rows = rows

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, i: int) -> dict:
        noise = np.random.standard_normal(3).astype(np.float32)
        flip = random.random() < 0.5
        return {"x": noise + i, "flip": np.int32(flip), "row": np.int32(i)}


class RarelyRandomDataset(torch.utils.data.Dataset):
    """Row ``i``; only the last row draws, from one global generator (numpy's,
    Python's ``random``, its ``gauss``, or torch's): augmentation that is
    applied now and then."""

    def __init__(self, rows: int = 64, generator: str = "numpy"):
        self.rows, self.generator = rows, generator

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, i: int) -> dict:
        draw = {
            "numpy": np.random.random,
            "python": random.random,
            "python-gauss": lambda: random.gauss(0, 1),
            "torch": lambda: torch.rand(()).item(),
        }[self.generator]
        x = np.float32(i) + (draw() if i == self.rows - 1 else 0)
        return {"x": np.array([x], np.float32), "row": np.int32(i)}
