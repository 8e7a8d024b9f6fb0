"""torchsparse.backbones: SparseResNet21D and SparseResUNet42 (2.1's layouts and parameter names)."""
from .modules import SparseConvBlock, SparseConvTransposeBlock, SparseResBlock
from .resnet import SparseResNet, SparseResNet21D
from .unet import SparseResUNet, SparseResUNet42

__all__ = ["SparseResNet21D", "SparseResUNet42", "SparseResNet", "SparseResUNet", "SparseConvBlock",
           "SparseConvTransposeBlock", "SparseResBlock"]
