"""Plain user networks for the ``model.name: module:factory`` tests (importable: tests/ is on
sys.path). Nothing here knows about nesting."""
import torch
import torch.nn.functional as F
from torch import nn


def small_cnn(num_classes: int, in_channels: int, input_size: int, hidden: int = 64) -> nn.Module:
    side = input_size // 2
    return nn.Sequential(
        nn.Conv2d(in_channels, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * side * side, hidden), nn.ReLU(),
        nn.Linear(hidden, num_classes))


def not_a_module(num_classes: int, in_channels: int, input_size: int):
    return "a string"


def small_cnn_relu6(num_classes: int, in_channels: int, input_size: int) -> nn.Module:
    """ReLU6 after nested layers: their keep-probability rescale folds forward (trainer.nest)."""
    side = input_size // 2
    return nn.Sequential(
        nn.Conv2d(in_channels, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU6(),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU6(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * side * side, 64), nn.ReLU6(), nn.Linear(64, num_classes))


class ConcatNet(nn.Module):
    """Two nestable branches concatenated (one ReLU6: its rescale folds forward through the cat
    and a max pool), then a conv that reads both segments at their offsets (the concat tests of
    trainer.nest and of the weight store)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.a = nn.Conv2d(16, 16, 3, padding=1)
        self.bn_a = nn.BatchNorm2d(16)
        self.b = nn.Conv2d(16, 32, 1)
        self.mix = nn.Conv2d(48, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 4, 10)

    def forward(self, x):
        y = F.relu(self.stem(x))
        y = torch.cat([F.relu6(self.bn_a(self.a(y))), F.relu(self.b(y))], 1)
        y = F.relu(self.mix(F.max_pool2d(y, 2)))
        return self.fc(torch.flatten(F.avg_pool2d(y, 2), 1))
