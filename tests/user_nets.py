"""Plain user networks for the ``model.name: module:factory`` tests (importable: tests/ is on
sys.path). Nothing here knows about nesting."""
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
