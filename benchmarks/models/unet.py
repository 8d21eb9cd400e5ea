"""A U-Net-like segmentation model with skip connections at every scale and an FPN-style
multi-scale head, for the device-mapping benchmark (Parmesan Table 2 used SemanticFPN, whose
partitions carry many skip connections).

Captured through the ``FILE.py:FUNCTION`` model spec::

    shardplan capture benchmarks/models/unet.py:unet -o unet.json
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["UNet", "unet"]


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(x)))


class UNet(nn.Module):
    """Encoder of ``depth`` blocks (channels doubling, max-pool between), a bottleneck, a
    decoder that concatenates the encoder output of the same scale (U-Net skips), and an FPN
    head that upsamples every decoder level to full size and sums them (more skips)."""

    def __init__(self, in_channels: int = 3, num_classes: int = 19, width: int = 32,
                 depth: int = 4) -> None:
        super().__init__()
        chans = [width * 2 ** i for i in range(depth + 1)]
        self.down = nn.ModuleList()
        cin = in_channels
        for c in chans[:-1]:
            self.down.append(_Block(cin, c))
            cin = c
        self.bottleneck = _Block(chans[-2], chans[-1])
        self.up = nn.ModuleList()
        self.fuse = nn.ModuleList()
        self.lateral = nn.ModuleList()
        for i in range(depth - 1, -1, -1):
            self.up.append(nn.ConvTranspose2d(chans[i + 1], chans[i], 2, stride=2))
            self.fuse.append(_Block(2 * chans[i], chans[i]))
            self.lateral.append(nn.Conv2d(chans[i], width, 1))
        self.head = nn.Conv2d(width, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.bottleneck(x)
        size = skips[0].shape[-2:]
        out = None
        for up, fuse, lateral, skip in zip(self.up, self.fuse, self.lateral, reversed(skips),
                                           strict=True):
            x = fuse(torch.cat([up(x), skip], dim=1))
            y = F.interpolate(lateral(x), size=size, mode="nearest")
            out = y if out is None else out + y
        return self.head(out)


def unet(batch_size: int = 8, image_size: int = 128) -> tuple[nn.Module, torch.Tensor]:
    """``(model, example_inputs)`` for ``shardplan capture benchmarks/models/unet.py:unet``."""
    return UNet(), torch.randn(batch_size, 3, image_size, image_size)
