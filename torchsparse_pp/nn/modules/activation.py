"""Point-wise activations on SparseTensor features."""
from torch import nn

from .feature_wise import FeatureWise


class ReLU(FeatureWise, nn.ReLU):
    pass


class LeakyReLU(FeatureWise, nn.LeakyReLU):
    pass


class SiLU(FeatureWise, nn.SiLU):
    pass
