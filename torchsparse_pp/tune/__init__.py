"""Sparse Autotuner: per-group dataflow tuning on measured end-to-end latency.

    result = tune(model, samples, mode="inference")   # or mode="training", binding="workload"
    print(result.table()); result.save("configs/tuned/minkunet_cpu.yaml")
    apply(model, "configs/tuned/minkunet_cpu.yaml")    # later, on the same model and device

See docs/autotune.md.
"""
from .binding import BINDINGS, MODES, PASSES, slots
from .configfile import TunedFile, TunedFileError, apply, load_tuned, save_tuned
from .groups import Group, LayerInfo, conv_layers, discover_groups
from .identity import device_name, structural_hash
from .measure import EndToEndTimer, fresh, output_loss
from .search import SearchResult, greedy_search, uniform
from .space import DESIGN_SPACE, SPACES, config_name, design_space
from .tuner import TuneResult, tune

__all__ = ["BINDINGS", "MODES", "PASSES", "DESIGN_SPACE", "SPACES", "EndToEndTimer", "Group", "LayerInfo",
           "SearchResult", "TuneResult", "TunedFile", "TunedFileError", "apply", "config_name", "conv_layers",
           "design_space", "device_name", "discover_groups", "fresh", "greedy_search", "load_tuned",
           "output_loss", "save_tuned", "slots", "structural_hash", "tune", "uniform"]
