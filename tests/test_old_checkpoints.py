"""Checkpoints saved before a module of the model was renamed (issue 27: CrammedModel.rpe -> score_bias, the slot
for any score bias) still load, with the same logits: a state dict through load_state_dict (resume), a folder
through init_from and through Hugging Face's from_pretrained, the copied remote code included."""

import subprocess
import sys
import textwrap

import torch
from safetensors.torch import load_file, save_file

from cramming.model import CrammedConfig, CrammedForMaskedLM, auto_map_of
from cramming.model.configuration_crammed import OLD_KEYS, current_key

TINY = {"vocab_size": 97, "hidden_size": 32, "num_layers": 2, "num_heads": 4, "ffn_size": 64, "max_seq_length": 16,
        "position": "rpe", "init_std": 0.3}


def old_names(state: dict) -> dict:
    """A state dict as the code before the rename saved it."""
    return {k.replace("encoder.score_bias.", "encoder.rpe."): v for k, v in state.items()}


def trained(seed=0):
    torch.manual_seed(seed)
    return CrammedForMaskedLM(CrammedConfig(**TINY)).eval()


def test_the_score_bias_is_saved_under_its_new_name_and_read_under_both():
    assert "encoder.score_bias.embedding.weight" in trained().state_dict()
    assert current_key("encoder.rpe.embedding.weight") == "encoder.score_bias.embedding.weight"
    assert current_key("rpe.embedding.weight") == "score_bias.embedding.weight"  # the base model's own names
    assert current_key("encoder.layers.0.attn.qkv.weight") == "encoder.layers.0.attn.qkv.weight"
    assert OLD_KEYS == {"rpe.": "score_bias."}


def test_an_old_state_dict_loads_strictly_and_gives_the_same_logits():
    source, target = trained(0), trained(1)
    ids = torch.randint(5, 97, (2, 16), generator=torch.Generator().manual_seed(0))
    target.load_state_dict(old_names(source.state_dict()))  # strict: no key missing or unexpected
    torch.testing.assert_close(target(ids).logits, source(ids).logits, rtol=0, atol=0)
    target.encoder.load_state_dict({k.removeprefix("encoder."): v for k, v in old_names(source.state_dict()).items()
                                    if k.startswith("encoder.")})  # the base model alone: no prefix


def test_an_old_checkpoint_folder_loads_through_from_pretrained_and_the_remote_code(tmp_path):
    model = trained()
    model.config.auto_map = auto_map_of(model)
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    assert "encoder.score_bias.embedding.weight" in weights
    save_file(old_names(weights), tmp_path / "model.safetensors", metadata={"format": "pt"})
    ids = torch.randint(5, 97, (2, 16), generator=torch.Generator().manual_seed(0))
    torch.save({"ids": ids, "logits": model(ids).logits}, tmp_path / "expected.pt")
    ours = CrammedForMaskedLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(ours(ids).logits, model(ids).logits, rtol=0, atol=0)
    script = textwrap.dedent(f"""
        import sys, torch
        from transformers import AutoModelForMaskedLM
        path = {str(tmp_path)!r}
        expected = torch.load(path + "/expected.pt")
        mlm, info = AutoModelForMaskedLM.from_pretrained(path, trust_remote_code=True, output_loading_info=True)
        assert "cramming" not in sys.modules
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        torch.testing.assert_close(mlm.eval()(expected["ids"]).logits, expected["logits"], rtol=0, atol=0)
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


def test_a_weight_average_saved_under_the_old_names_is_restored_not_restarted(capsys):
    """train.resume of a run saved before the rename: its EMA follows the same parameters, under their old names."""
    from types import SimpleNamespace

    from cramming.train.averaging import build_averaging

    settings = SimpleNamespace(averaging="ema", ema=SimpleNamespace(decay=0.5))
    source, target = build_averaging(settings, trained(0)), build_averaging(settings, trained(1))
    source.update(1, 0.5)
    saved = source.state_dict()
    saved["names"] = [k.replace("encoder.score_bias.", "encoder.rpe.") for k in saved["names"]]
    assert saved["names"] != target.names
    target.load_state_dict(saved, "old-run")
    assert "starts afresh" not in capsys.readouterr().out
    assert all(torch.equal(a, b) for a, b in zip(target.averaged(), source.averaged()))
