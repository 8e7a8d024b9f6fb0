"""nn"""
from . import functional
