import bitsandbytes as bnb  # expect: LIB007
from transformers import AutoModelForCausalLM, BitsAndBytesConfig  # expect: LIB008


def load(name):
    cfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype="bfloat16")  # expect: LIB008
    model = AutoModelForCausalLM.from_pretrained(
        name,
        load_in_8bit=True,  # expect: LIB008
        device_map="auto",
    )
    opt = bnb.optim.AdamW8bit(model.parameters(), lr=1e-4, optim_bits=8)  # expect: LIB007
    layer = bnb.nn.Linear8bitLt(16, 16)  # expect: LIB007
    return cfg, model, opt, layer
