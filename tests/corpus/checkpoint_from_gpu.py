"""Load a checkpoint that was saved on a CUDA machine (storages tagged 'cuda:0')."""
import sys

import torch
import torch.nn as nn

path = sys.argv[1]
model = nn.Linear(3, 2)
state = torch.load(path)  # no map_location: as written on the GPU box
model.load_state_dict(state["model"])
model.cuda()
state = torch.load(path, map_location="cuda:0")
state = torch.load(path, map_location=lambda storage, loc: storage.cuda(0))
state = torch.load(path, map_location={"cuda:0": "cuda:1"})
assert state["step"] == 7
print("checkpoint OK", model.weight.device)
