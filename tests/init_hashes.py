"""The weights each architecture starts from, as one hash per tensor: tests/test_init_hook.py compares a fresh
build against tests/fixtures/init_hashes.json, written by `python tests/init_hashes.py` on the code before
the model's init moved into each module's own hook (issue 27), so the move provably changed no weight. A preset
added since gets its case recorded when it is added (`python tests/init_hashes.py --add`), so a later change to
its init shows."""

import hashlib
import json
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from cramming import impl as impl_
from cramming.data.tokenizer import SPECIAL_IDS
from cramming.run import build_model
from cramming.validation import load_config

CONF = Path(__file__).resolve().parents[1] / "conf"
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "init_hashes.json"
SMALL = ["arch.num_layers=6", "arch.hidden_size=32", "arch.num_heads=2", "arch.ffn_size=64",
         "arch.max_seq_length=128", "impl=cpu", "data=sanity", "data.vocab_size=128", "data.seq_length=128"]
PRESETS = [p.stem for p in sorted((CONF / "arch").glob("*.yaml"))]
COMBOS = [
    *[[f"arch.position={p}"] for p in ("none", "learned", "sinusoidal", "scaled-sinusoidal", "alibi", "rpe",
                                        "rotary")],
    *[[f"arch.linear={k}"] for k in ("lowrank", "kronecker", "monarch", "btt", "btt-moe")],
    *[[f"arch.norm={n}"] for n in ("rmsnorm", "scalenorm")],
    *[[f"arch.init={i}"] for i in ("small", "megatron-scaled")],
    ["arch.layout=[gmlp]"], ["arch.layout=[attention,gmlp]", "arch.position=learned"],
    ["arch.parametrization=mup"], ["arch.qk_norm=true", "arch.bias=true", "arch.head_transform=true"],
    ["arch.zero_init_out=true", "arch.value_embeddings=1", "arch.unet_skips=true"],
    ["arch.token_dropping.keep=0.5"], ["arch.objective=rtd"], ["arch.objective=clm", "arch.ffn=mlp"],
    ["arch.tie_embeddings=false"], ["arch.norm_position=post", "arch.embedding_norm=false"],
]
CASES = {f"arch={p}": [f"arch={p}"] for p in PRESETS} | {
    " ".join(c): ["arch=crammed-bert-tiny", *c] for c in COMBOS}


def hashes(overrides: list[str]) -> dict[str, str]:
    """Every parameter and buffer of the model these overrides build at seed 0, as a sha256 of its bytes."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        config = load_config(compose(config_name="pretrain", overrides=overrides + SMALL))
    torch.manual_seed(0)
    model = build_model(config.arch, 128, SPECIAL_IDS, impl_.resolve(config.impl, config.arch))
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    return {k: hashlib.sha256(v.detach().float().contiguous().numpy().tobytes()).hexdigest()[:16]
            for k, v in sorted(tensors.items())}


if __name__ == "__main__":
    # `--add`: only the cases the fixture lacks (a preset added since), the recorded ones left as they are
    known = json.loads(FIXTURE.read_text()) if "--add" in sys.argv else {}
    added = {name: hashes(o) for name, o in CASES.items() if name not in known}
    FIXTURE.write_text(json.dumps(known | added, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(added)} cases to {FIXTURE}: {', '.join(sorted(added))}", file=sys.stderr)
