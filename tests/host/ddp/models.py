"""The model the DDP hook tests train: parameters of 1 to 5000 values, each its own bucket."""
import torch

__all__ = ["Buckets"]


class Buckets(torch.nn.Module):
    """Parameters of 1 .. 5000 values plus biases: with a tiny bucket cap DDP rebuilds its
    buckets after the first iteration into one per parameter."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(1))
        self.pair = torch.nn.Parameter(torch.tensor([0.5, -0.25]))
        self.triple = torch.nn.Parameter(torch.tensor([0.1, 0.2, -0.3]))
        self.fc1 = torch.nn.Linear(6, 50)            # 300 + 50
        self.fc2 = torch.nn.Linear(50, 100)          # 5000 + 100
        self.out = torch.nn.Linear(100, 1)           # 100 + 1

    def forward(self, x):
        h = torch.tanh(self.fc1(x * self.scale) + self.pair.sum())
        h = torch.tanh(self.fc2(h)) * (1 + self.triple.sum())
        return self.out(h)
