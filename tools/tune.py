"""Tune a config's model: python tools/tune.py --config configs/X.yaml --synthetic --out configs/tuned/X.yaml
(same arguments as `torchsparse-pp tune`; see docs/autotune.md)."""
import sys

from torchsparse_pp.tune.command import main

if __name__ == "__main__":
    sys.exit(main())
