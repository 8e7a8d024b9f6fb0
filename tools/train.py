"""Train from a YAML config: python tools/train.py --config configs/X.yaml [section.key=value ...]
(torchrun --nproc_per_node N tools/train.py ... for N processes)."""
import sys

from torchsparse_pp.train.commands import main_train

if __name__ == "__main__":
    sys.exit(main_train())
