"""The data and models of benchmarks/align.py: Fashion-MNIST from its Debian package, a residual CNN with
BatchNorm, an nn.MultiheadAttention classifier on MNIST rows, their cached Adam training, and how far training
moved a model from its init."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

FASHION = Path("/usr/share/datasets/fashion-mnist")


def load_fashion() -> tuple[torch.Tensor, ...] | None:
    """Fashion-MNIST from the Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist)."""
    files = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
             "t10k-labels-idx1-ubyte.gz"]
    if not all((FASHION / f).is_file() for f in files):
        return None
    out = []
    for f in files:
        raw = np.frombuffer(gzip.open(FASHION / f).read(), dtype=np.uint8)
        images = "images" in f
        data = raw[16:].reshape(-1, 784).astype(np.float32) / 255 if images else raw[8:].astype(np.int64)
        out.append(torch.from_numpy(data.copy()))
    return tuple(out)


class ResCNN(nn.Module):
    """conv(stride 2) -> BN -> ReLU, a residual block at width w (14 x 14), a downsampling residual block
    at 2w (7 x 7) with a 1x1 shortcut, average pool, linear: ResNet's structure at CPU size."""

    def __init__(self, w: int = 16, classes: int = 10) -> None:
        super().__init__()
        conv = lambda a, b, s=1: nn.Conv2d(a, b, 3, stride=s, padding=1, bias=False)  # noqa: E731
        self.conv1, self.bn1 = conv(1, w, 2), nn.BatchNorm2d(w)
        self.b1c1, self.b1n1, self.b1c2, self.b1n2 = conv(w, w), nn.BatchNorm2d(w), conv(w, w), nn.BatchNorm2d(w)
        self.b2c1, self.b2n1 = conv(w, 2 * w, 2), nn.BatchNorm2d(2 * w)
        self.b2c2, self.b2n2 = conv(2 * w, 2 * w), nn.BatchNorm2d(2 * w)
        self.short, self.shortn = nn.Conv2d(w, 2 * w, 1, stride=2, bias=False), nn.BatchNorm2d(2 * w)
        self.fc = nn.Linear(2 * w, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x.view(-1, 1, 28, 28))))
        x = F.relu(x + self.b1n2(self.b1c2(F.relu(self.b1n1(self.b1c1(x))))))
        x = F.relu(self.shortn(self.short(x)) + self.b2n2(self.b2c2(F.relu(self.b2n1(self.b2c1(x))))))
        return self.fc(x.mean((2, 3)))

    def example_inputs(self) -> tuple[torch.Tensor]:
        return (torch.randn(4, 784, generator=torch.Generator().manual_seed(0)),)


class MHAClassifier(nn.Module):
    """A small attention classifier on MNIST rows as a sequence: a linear embedding of each 28-pixel row plus
    a learnt position, `blocks` pre-LayerNorm blocks (nn.MultiheadAttention, then a ReLU MLP), a final
    LayerNorm, mean pooling over the rows, a linear head."""

    def __init__(self, d: int = 64, heads: int = 4, blocks: int = 2, hidden: int = 128, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Linear(28, d)
        self.pos = nn.Parameter(0.02 * torch.randn(28, d))
        self.attn = nn.ModuleList(nn.MultiheadAttention(d, heads, batch_first=True) for _ in range(blocks))
        self.norm1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(blocks))
        self.norm2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(blocks))
        self.fc1 = nn.ModuleList(nn.Linear(d, hidden) for _ in range(blocks))
        self.fc2 = nn.ModuleList(nn.Linear(hidden, d) for _ in range(blocks))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.view(-1, 28, 28)) + self.pos
        for attn, n1, n2, f1, f2 in zip(self.attn, self.norm1, self.norm2, self.fc1, self.fc2):
            z = n1(h)
            h = h + attn(z, z, z, need_weights=False)[0]
            h = h + f2(F.relu(f1(n2(h))))
        return self.head(self.norm(h).mean(1))

    def example_inputs(self) -> tuple[torch.Tensor]:
        return (torch.randn(4, 784, generator=torch.Generator().manual_seed(0)),)


def train_classifier(make, x: torch.Tensor, y: torch.Tensor, seed: int, epochs: int, batch: int, lr: float,
                     path: Path) -> nn.Module:
    """Adam, shuffled minibatches (seeded); cached at `path`."""
    torch.manual_seed(seed)
    model = make()
    if path.is_file():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model.eval()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=gen).split(batch):
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    return model.eval()


def classify(model: nn.Module, batch) -> dict[str, torch.Tensor]:
    logits = model(batch[0])
    return {"loss": F.cross_entropy(logits, batch[1]), "acc": (logits.argmax(-1) == batch[1]).double().mean()}


def drift(model: nn.Module, init: nn.Module) -> float:
    """|W - W_init| / |W_init| over the weight matrices: how far training moved them from the random init."""
    pairs = [(p, q) for p, q in zip(model.parameters(), init.parameters()) if p.dim() >= 2]
    moved = sum(float((p.detach() - q.detach()).double().pow(2).sum()) for p, q in pairs)
    return (moved / sum(float(q.detach().double().pow(2).sum()) for _, q in pairs)) ** 0.5


def initial_model(make, seed: int) -> nn.Module:
    torch.manual_seed(seed)  # train_classifier's init: the seed, then the model
    return make()
