"""Helpers shared by the torch-side tests (importable because pytest puts tests/ on sys.path)."""
import torch


def randomise(model, seed: int) -> None:
    """Random ordering logits and BN statistics, so truncation, keep-probability scales and BN
    folding are tested far from their initial values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for u in model.orderings() if hasattr(model, "orderings") else []:
            u.mubar.copy_(torch.randn(u.mubar.shape, generator=g, dtype=u.mubar.dtype) * 2)
        for m in model.modules():
            if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)


def write_photos(folder, classes=("cat", "dog"), n=8, seed=0, fmt="jpg", sizes=(20, 41)) -> None:
    """``folder/<class>/<i>.<fmt>``: photos of varied size and aspect (portrait, landscape),
    the class showing in one colour channel (a small network learns it in an epoch)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c, name in enumerate(classes):
        (folder / name).mkdir(parents=True)
        for i in range(n):
            h, w = (int(v) for v in rng.integers(*sizes, 2))
            px = rng.integers(0, 120, (h, w, 3), dtype=np.uint8)
            px[..., c % 3] += 120
            Image.fromarray(px).save(folder / name / f"{i}.{fmt}", quality=90)
