"""A DataLoader with pinned memory and spawned workers, batches moved non_blocking."""
import torch
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        # workers are fresh interpreters with the spawn method: CUDA calls here must work too
        assert torch.cuda.is_available()
        return torch.tensor([float(i)]), torch.tensor([float(i * i)])


if __name__ == "__main__":
    loader = DataLoader(Squares(), batch_size=4, num_workers=2, pin_memory=True,
                        multiprocessing_context="spawn", persistent_workers=False)
    total = 0.0
    for x, y in loader:
        x, y = x.cuda(non_blocking=True), y.to("cuda", non_blocking=True)
        total += float((y - x * x).abs().sum())
    assert total == 0.0
    print("dataloader OK")
