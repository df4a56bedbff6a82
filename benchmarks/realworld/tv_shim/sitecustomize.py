"""Harness-only: let the CUDA build of torchvision import on this CPU-only torch.

The only torchvision wheel for torch 2.13 on the package index is a CUDA build; its C++
ops library does not load here, and ``import torchvision`` then fails on
``torch.library.register_fake("torchvision::nms")`` ("operator torchvision::nms does not
exist"). Before torchvision first imports, this defines the schemas of the two ops that
torchvision registers fake kernels for at import (``nms``, ``qnms``), so the pure-Python
parts (transforms, datasets, models) work; calling those two ops still fails. It is on
``PYTHONPATH`` only for the acceptance run (benchmarks/realworld/run.py), never part of
torch_adapter, and costs nothing until something imports torchvision.
"""

import importlib.abc
import sys


class _DefineTorchvisionOps(importlib.abc.MetaPathFinder):
    done = False

    def find_spec(self, fullname, path, target=None):
        if fullname == "torchvision" and not self.done:
            self.done = True
            import torch

            try:
                lib = torch.library.Library("torchvision", "DEF")
                for name in ("nms", "qnms"):
                    lib.define(f"{name}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
                _KEEP.append(lib)
            except RuntimeError:  # already defined (a torchvision whose ops library loads)
                pass
        return None


_KEEP = []
sys.meta_path.insert(0, _DefineTorchvisionOps())
