"""Synthetic datasets on disk for module-scoped fixtures (each with its own drawn seed)."""
from conftest import fresh_seed
from torchsparse_pp.data.synth import write_synthetic


def synthetic_root(tmp_path_factory, format: str, scans: int, **kwargs):
    root = tmp_path_factory.mktemp(format)
    write_synthetic(root, format, scans=scans, seed=fresh_seed() % 1000, progress=False, **kwargs)
    return root
