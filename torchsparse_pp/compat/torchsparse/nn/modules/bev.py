"""torchsparse 2.1's BEV modules: not provided.

In 2.1 they index coordinate columns as torchsparse 1.x's batch-last ``(x, y, z, batch)``
layout did, so with 2.1's batch-first coordinates they mix the batch column into the BEV
coordinates; their outputs are not reproduced. Constructing one raises and names a replacement."""


def _unavailable(name: str):
    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            f"torchsparse.nn.{name} is not provided: torchsparse 2.1's BEV modules index coordinates in torchsparse "
            "1.x's batch-last layout. Use torchsparse_pp.nn.ToDense (dense [B, C, X, Y, Z]) and fold the height "
            "axis into channels, as torchsparse_pp.models.centerpoint.bev.height_compression does")
    return type(name, (), {"__init__": __init__})


ToBEVConvolution = _unavailable("ToBEVConvolution")
ToBEVReduction = _unavailable("ToBEVReduction")
ToDenseBEVConvolution = _unavailable("ToDenseBEVConvolution")
ToBEVHeightCompression = _unavailable("ToBEVHeightCompression")
