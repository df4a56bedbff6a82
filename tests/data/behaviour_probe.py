"""Run a set of torch behaviours before install, during and after uninstall; print JSON.

Used by tests/test_behaviour_reversible.py in a fresh interpreter per scenario:
``python behaviour_probe.py SCENARIO``. A behaviour's value is what torch did (a device,
a dtype, a sum, or the error's type), never which function is installed.

Scenarios (what happens before ``install()``):
  plain         run the behaviours first (torch's caches are built before install)
  cold          nothing: torch's factory set is first built while installed
  libs_before   import transformers and accelerate, then run the behaviours
  libs_during   import transformers and accelerate only while installed (cold torch)
"""

from __future__ import annotations

import io
import json
import sys
import warnings

warnings.simplefilter("ignore")


def _try(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the error's type is the behaviour
        return f"error: {type(exc).__name__}"


def behaviours(libs: bool) -> dict:
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    out: dict = {}
    with torch.device("meta"):
        out["with meta: empty"] = torch.empty(2).device.type
        out["with meta: Linear"] = nn.Linear(2, 2).weight.device.type
        out["with meta: tensor"] = torch.tensor([1.0]).device.type
    torch.set_default_device("meta")
    out["default meta: zeros"] = torch.zeros(3).device.type
    out["default meta: get_default_device"] = str(torch.get_default_device())
    torch.set_default_device(None)
    out["default device"] = str(torch.get_default_device())

    from torch.utils._device import set_device

    @set_device("meta")
    def build():
        return torch.ones(2)

    out["torch.utils._device.set_device decorator"] = build().device.type
    out["factories"] = [torch.zeros(2, 3).sum().item(), torch.arange(5).tolist(), str(torch.tensor([1, 2]).dtype),
                        torch.full((2,), 3.0).tolist(), torch.eye(2).tolist(), str(torch.empty(1).device)]
    lin = nn.Linear(4, 2)
    x = torch.randn(3, 4)
    out["DataParallel forward"] = round(nn.DataParallel(lin)(x).sum().item(), 5)
    out["DataParallel.cuda()"] = _try(lambda: type(nn.DataParallel(lin).cuda()).__name__)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out["autocast cpu mm"] = str((x @ x.T).dtype)
        out["autocast enabled"] = torch.is_autocast_enabled("cpu")
    out["autocast after"] = torch.is_autocast_enabled("cpu")

    def autocast_cuda():
        with torch.autocast("cuda"):
            return str((x @ x.T).dtype)

    out["autocast cuda mm"] = _try(autocast_cuda)
    out["DataParallel.cuda() forward"] = _try(lambda: round(nn.DataParallel(lin).cuda()(x.cuda()).sum().item(), 5))
    buf = io.BytesIO()
    torch.save({"w": torch.arange(3.0)}, buf)
    for label, loc in (("none", None), ("str", "cpu"), ("device", torch.device("cpu")), ("dict", {"cpu": "cpu"}),
                       ("callable", lambda s, _loc: s)):
        buf.seek(0)
        out[f"load map_location={label}"] = torch.load(buf, map_location=loc)["w"].tolist()
    out["int ordinal .to(0)"] = _try(lambda: str(torch.ones(1).to(0).device))
    out["cuda factory"] = _try(lambda: str(torch.zeros(1, device="cuda").device))
    out["cuda available"] = torch.cuda.is_available()
    out["torch.device(0)"] = _try(lambda: str(torch.device(0)))
    out["pickled devices"] = __import__("pickle").dumps([torch.device("cuda", 1), torch.device("cpu")]).hex()
    out["isinstance device"] = isinstance(torch.ones(1).device, torch.device)
    out["Generator"] = [torch.Generator().device.type, isinstance(torch.Generator(), torch.Generator)]
    out["Module.to(float64)"] = str(nn.Linear(2, 2).to(torch.float64).weight.dtype)
    if libs:
        from accelerate import init_empty_weights

        with init_empty_weights():
            m = nn.Linear(2, 2)
            m.register_buffer("b", torch.ones(2))
        out["accelerate init_empty_weights"] = [m.weight.device.type, m.b.device.type]
        with init_empty_weights(include_buffers=True):
            m = nn.Linear(2, 2)
            m.register_buffer("b", torch.ones(2))
        out["accelerate init_empty_weights(buffers)"] = [m.weight.device.type, m.b.device.type]
        from transformers import CLIPTextConfig, CLIPTextModel

        cfg = CLIPTextConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                             num_attention_heads=2, max_position_embeddings=7, bos_token_id=0, eos_token_id=2,
                             pad_token_id=1)
        with torch.device("meta"):
            model = CLIPTextModel(cfg)
        out["transformers under meta"] = model.embeddings.position_ids.device.type
    return out


def main(scenario: str) -> None:
    import torch  # noqa: F401
    from torch.utils import _device

    phases = {}
    libs = scenario in ("libs_before", "libs_during")
    if scenario == "libs_before":
        import accelerate  # noqa: F401
        import transformers  # noqa: F401
    if scenario in ("plain", "libs_before"):
        phases["before"] = behaviours(libs)
    phases["cache built before install"] = _device._device_constructors.cache_info().currsize > 0

    import torch_adapter

    torch_adapter.install("cpu")
    if scenario == "libs_during":
        import accelerate  # noqa: F401, F811
        import transformers  # noqa: F401, F811
    phases["during"] = behaviours(libs)
    # the default dtype policy (auto) on this CPU's kind: float32 where float16 is computed in float32
    phases["float16 on the device"] = str(torch.ones(1, device="cuda", dtype=torch.float16).dtype)
    torch_adapter.uninstall()
    phases["after"] = behaviours(libs)
    print(json.dumps(phases))


if __name__ == "__main__":
    main(sys.argv[1])
