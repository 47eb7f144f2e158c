"""Velocity models: the physics. Each is a frozen object of physical parameters."""
from .attention import Attention
from .base import Model, tangent_project
from .prescribed import Prescribed
from .terms import FeedForward, Layers, MultiHead, Noise, Sum
from .zero_temperature import ZeroTemperature

__all__ = ["Attention", "FeedForward", "Layers", "Model", "MultiHead", "Noise", "Prescribed", "Sum", "ZeroTemperature",
           "tangent_project"]
