"""The multilayer perceptron of paper 000, section 4 (zoo name ``mlp``).

Three ``Linear`` layers and a softmax over 10 classes, on 767 bag-of-words features
(767 -> 1024 -> 1024 -> 10, ReLU between the layers, which the paper leaves unsaid).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["MLP"]


class MLP(nn.Module):
    """Paper 000's benchmark model: three ``Linear`` layers followed by a softmax."""

    def __init__(self, in_features: int = 767, hidden: int = 1024, num_classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.relu1 = nn.ReLU()
        self.fc2 = nn.Linear(hidden, hidden)
        self.relu2 = nn.ReLU()
        self.fc3 = nn.Linear(hidden, num_classes)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.softmax(self.fc3(self.relu2(self.fc2(self.relu1(self.fc1(x))))))
