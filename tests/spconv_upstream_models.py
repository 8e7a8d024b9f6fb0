"""Upstream spconv models, built from the unmodified files in ../shared/upstream, run in this
process on whichever ``spconv`` it imports (the real one, or torchsparse_pp's after the alias).

``run_model(name, peer, inputs, out)`` (called by ``spconv_upstream.py model ...`` in a
subprocess): builds the model in float64; on ``real`` randomises every parameter and saves the
state dict; on ``ours`` loads that state dict with strict=True. It then runs forward in training
mode, backward of sum(output * r) over every output (r seeded), and saves the outputs (sparse
ones as indices and features) and every parameter's gradient.
"""
from functools import partial
from typing import Callable, Dict, Tuple

import numpy as np
import torch
from torch import nn

from spconv_upstream import stub_missing, use_upstream

Outputs = Dict[str, torch.Tensor]


class Config(dict):
    """The attribute-access config object OpenPCDet passes around (as easydict's)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError as error:
            raise AttributeError(name) from error


class AttributeDict(Config):
    """Keys read and written as attributes (what Pointcept uses of addict.Dict)."""

    def __setattr__(self, name, value):
        self[name] = value


def sparse(prefix: str, tensor) -> Outputs:
    return {f"{prefix}.indices": tensor.indices, f"{prefix}.features": tensor.features}


# --- OpenPCDet --------------------------------------------------------------------------------------
def _openpcdet() -> None:
    use_upstream("OpenPCDet")
    # Imports of OpenPCDet's files unrelated to sparse convolution.
    stub_missing(["SharedArray", "skimage", "skimage.transform", "torchvision", "pcdet.utils.box_utils"])


def data_processor(inputs: dict, voxel_size, max_voxels: int):
    """OpenPCDet's DataProcessor (range mask, then spconv's Point2VoxelCPU3d voxelization)."""
    _openpcdet()
    from pcdet.datasets.processor.data_processor import DataProcessor

    configs = [Config(NAME="mask_points_and_boxes_outside_range", REMOVE_OUTSIDE_BOXES=True),
               Config(NAME="transform_points_to_voxels", VOXEL_SIZE=voxel_size, MAX_POINTS_PER_VOXEL=5,
                      MAX_NUMBER_OF_VOXELS={"train": max_voxels, "test": max_voxels})]
    pc_range = np.array(inputs["point_cloud_range"], dtype=np.float32)
    return DataProcessor(configs, pc_range, training=True, num_point_features=4)


def voxelize(inputs: dict, voxel_size, max_voxels: int) -> dict:
    """Per scan, the DataProcessor's voxels; then OpenPCDet's collation (batch index first)."""
    processor = data_processor(inputs, voxel_size, max_voxels)
    samples = []
    for points in inputs["points"]:
        sample = {"points": points, "use_lead_xyz": True}
        for step in processor.data_processor_queue:
            sample = step(data_dict=sample)
        samples.append(sample)
    coords = [np.pad(s["voxel_coords"], ((0, 0), (1, 0)), constant_values=b) for b, s in enumerate(samples)]
    return {"voxels": torch.from_numpy(np.concatenate([s["voxels"] for s in samples])),
            "voxel_num_points": torch.from_numpy(np.concatenate([s["voxel_num_points"] for s in samples])),
            "voxel_coords": torch.from_numpy(np.concatenate(coords)), "batch_size": len(samples),
            "grid_size": processor.grid_size, "voxel_size": processor.voxel_size}


def voxel_batch(inputs: dict) -> dict:
    """DataProcessor voxels, MeanVFE features (float64): what a 3-D backbone takes."""
    _openpcdet()
    from pcdet.models.backbones_3d.vfe.mean_vfe import MeanVFE

    batch = voxelize(inputs, inputs["voxel_size"], inputs["max_voxels"])
    batch = MeanVFE(Config(), num_point_features=4)(batch)
    batch["voxel_features"] = batch["voxel_features"].double()
    return batch


def _backbone_3d(module: str, cls: str, **extra) -> Tuple[Callable, Callable]:
    def build(inputs, batch):
        _openpcdet()
        namespace = __import__(f"pcdet.models.backbones_3d.{module}", fromlist=[cls])
        return getattr(namespace, cls)(Config(**inputs.get("model_cfg", {})), input_channels=4,
                                       grid_size=batch["grid_size"], **{k: f(inputs, batch) for k, f in extra.items()})
    return build, voxel_batch


def encoded_and_multi_scale(result: dict) -> Outputs:
    out = sparse("encoded", result["encoded_spconv_tensor"])
    for name, tensor in result["multi_scale_3d_features"].items():
        out.update(sparse(name, tensor))
    return out


def unet_outputs(result: dict) -> Outputs:
    return {**sparse("encoded", result["encoded_spconv_tensor"]), "point_features": result["point_features"],
            "point_coords": result["point_coords"]}


def pillar_batch(inputs: dict) -> dict:
    """Pillars: the DataProcessor's voxels of full height, (b, y, x) coordinates, 32 channels
    lifted from the MeanVFE means by a fixed random projection (a stand-in for PillarVFE)."""
    batch = voxel_batch(inputs)
    batch["pillar_coords"] = batch["voxel_coords"][:, [0, 2, 3]]
    batch["pillar_features"] = batch["voxel_features"] @ inputs["pillar_projection"]
    return batch


def pillar_build(inputs, batch):
    _openpcdet()
    from pcdet.models.backbones_3d.spconv_backbone_2d import PillarRes18BackBone8x

    return PillarRes18BackBone8x(Config(), input_channels=32, grid_size=batch["grid_size"])


def pillar_outputs(result: dict) -> Outputs:
    features = result["multi_scale_2d_features"]
    out = {}
    for name in ("x_conv1", "x_conv2", "x_conv3"):
        out.update(sparse(name, features[name]))
    out.update(x_conv4=features["x_conv4"], x_conv5=features["x_conv5"])
    return out


# --- Pointcept ---------------------------------------------------------------------------------------
class _Registry:
    def register_module(self, name=None, module=None, force=False):
        return (lambda cls: cls) if module is None else module


def _pointcept() -> None:
    use_upstream("Pointcept")
    stub_missing(["pointcept.models.builder", "timm", "timm.layers", "torch_geometric", "torch_geometric.utils",
                  "pointcept.engines", "pointcept.engines.hooks", "pointcept.models.point_prompt_training",
                  "torch_scatter"],
                 {"pointcept.models.builder": {"MODELS": _Registry()},
                  # Weight initialisation only: the state dict comes from the real peer.
                  "timm.layers": {"trunc_normal_": nn.init.trunc_normal_, "DropPath": _no_drop_path},
                  "pointcept.engines.hooks": {"HookBase": object},
                  "pointcept.models.point_prompt_training": {"PDNorm": nn.Module}})
    # Pointcept's Point is an addict.Dict (keys as attributes); a stand-in where addict is absent.
    stub_missing(["addict"], {"addict": {"Dict": AttributeDict}})


def _no_drop_path(*args, **kwargs):
    raise NotImplementedError("timm's DropPath is stubbed in these tests (drop_path=0 builds none)")


def point_batch(inputs: dict) -> dict:
    return {k: inputs[k] for k in ("coord", "grid_coord", "feat", "offset")}


def spunet_build(inputs, batch):
    _pointcept()
    from pointcept.models.sparse_unet.spconv_unet_v1m1_base import SpUNetBase

    return SpUNetBase(in_channels=batch["feat"].shape[1], num_classes=5, base_channels=16,
                      channels=(16, 32, 48, 64, 48, 32, 24, 24), layers=(1, 2, 2, 1, 1, 1, 1, 1))


class PTv3SparseParts(nn.Module):
    """PointTransformerV3's sparse-conv parts: its Embedding (SubMConv3d k5 padding 1 stem with
    BatchNorm and GELU) and a Block's conditional positional encoding (``cpe``: SubMConv3d k3,
    Linear, LayerNorm), applied to a Pointcept Point as PTv3 applies them. The Block's attention
    and MLP (and PTv3's pooling, which needs torch_scatter) are not run."""

    def __init__(self, in_channels: int, channels: int):
        super().__init__()
        from pointcept.models.point_transformer_v3.point_transformer_v3m1_base import Block, Embedding

        self.embedding = Embedding(in_channels, channels, norm_layer=partial(nn.BatchNorm1d, eps=1e-3, momentum=0.01),
                                   act_layer=nn.GELU)
        self.block = Block(channels, num_heads=2, patch_size=16, enable_flash=False, cpe_indice_key="stage0")

    def forward(self, batch: dict):
        from pointcept.models.utils.structure import Point

        point = Point(batch)
        point.sparsify()
        point = self.embedding(point)
        embedded = point.feat
        shortcut = point.feat
        point = self.block.cpe(point)  # as Block.forward begins
        return {"embedded": embedded, "cpe": shortcut + point.feat, "indices": point.sparse_conv_feat.indices}


def ptv3_build(inputs, batch):
    _pointcept()
    return PTv3SparseParts(batch["feat"].shape[1], 16)


MODELS: Dict[str, Tuple[Callable, Callable, Callable]] = {
    # name: (build(inputs, batch) -> module, batch(inputs) -> model input, outputs(result) -> tensors)
    "VoxelBackBone8x": (*_backbone_3d("spconv_backbone", "VoxelBackBone8x"), encoded_and_multi_scale),
    "VoxelResBackBone8x": (*_backbone_3d("spconv_backbone", "VoxelResBackBone8x"), encoded_and_multi_scale),
    "UNetV2": (*_backbone_3d("spconv_unet", "UNetV2", voxel_size=lambda i, b: b["voxel_size"],
                             point_cloud_range=lambda i, b: np.array(i["point_cloud_range"])), unet_outputs),
    "VoxelResBackBone8xVoxelNeXt": (*_backbone_3d("spconv_backbone_voxelnext", "VoxelResBackBone8xVoxelNeXt"),
                                    lambda r: {**sparse("encoded", r["encoded_spconv_tensor"]),
                                               **{k: v for name, t in r["multi_scale_3d_features"].items()
                                                  for k, v in sparse(name, t).items()}}),
    "PillarRes18BackBone8x": (pillar_build, pillar_batch, pillar_outputs),
    "SpUNet-v1m1": (spunet_build, point_batch, lambda features: {"logits": features}),
    "PTv3-sparse-parts": (ptv3_build, point_batch, lambda r: r),
}


def _randomise(model: nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype))


def _cpu_backward_stream() -> None:
    # spconv's CPU backward asks torch.cuda for a stream (tests/spconv_support.py).
    import spconv.pytorch.ops as spconv_ops

    if not torch.cuda.is_available():
        spconv_ops.get_current_stream = lambda: 0


def run_model(name: str, peer: str, inputs_path: str, out_path: str) -> None:
    if peer == "ours":
        from torchsparse_pp.compat import alias

        alias("spconv")
    torch.set_num_threads(1)  # spconv's CPU kernels race with more threads
    inputs = torch.load(inputs_path, weights_only=False)
    build, make_batch, outputs_of = MODELS[name]
    batch = make_batch(inputs)
    model = build(inputs, batch).double().train()
    if peer == "real":
        _cpu_backward_stream()
        _randomise(model, inputs["seed"])
        state = {k: v.clone() for k, v in model.state_dict().items()}  # before training-mode BatchNorm moves it
    else:
        state = inputs["state_dict"]
        model.load_state_dict(state, strict=True)
    outputs = {k: v for k, v in outputs_of(model(dict(batch))).items()}
    generator = torch.Generator().manual_seed(inputs["seed"] + 1)
    loss = sum((v * torch.randn(v.shape, generator=generator, dtype=v.dtype)).sum()
               for v in outputs.values() if v.is_floating_point())
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    torch.save({"outputs": {k: v.detach() for k, v in outputs.items()}, "grads": grads,
                "state_dict": state if peer == "real" else None,
                "voxels": {k: batch[k] for k in ("voxels", "voxel_coords", "voxel_num_points") if k in batch}},
               out_path)
