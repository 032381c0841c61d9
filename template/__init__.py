"""An image-classification recipe for PyTorch Lightning, as a project template."""

__version__ = "0.1.0"
