"""Evaluate a checkpoint: python tools/eval.py --config configs/X.yaml --checkpoint runs/X/last.pt"""
import sys

from torchsparse_pp.train.commands import main_eval

if __name__ == "__main__":
    sys.exit(main_eval())
