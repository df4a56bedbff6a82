"""Jupyter integration: ``%load_ext torch_adapter``, per-cell routing, magics.

IPython is imported only when the extension is loaded (never by ``import torch_adapter``).
"""
