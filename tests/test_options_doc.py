"""docs/options.md is generated from the schema (cramming/options_doc.py): it must match what the generator writes
now, so a new key, a changed default, rule, registry entry or field comment fails here until it is regenerated."""

from conftest import REPO

from cramming import options_doc


def test_options_doc_is_current():
    written = (REPO / "docs" / "options.md").read_text(encoding="utf-8")
    assert written == options_doc.render(), "docs/options.md is stale: python -m cramming.options_doc > docs/options.md"


def test_every_key_has_a_meaning_and_every_named_option_its_entries():
    """Each option's one line exists (the comment beside its field), and the options that name registry entries
    list them: the doc is the reference, so a blank row is a missing explanation."""
    named = options_doc.components()
    rows = options_doc.pretrain_rows(named) + options_doc.eval_rows(named)
    assert [row[0] for row in rows if not row[4]] == []
    by_key = {row[0]: row for row in rows}
    assert by_key["arch.norm"][3].startswith("layernorm, rmsnorm, scalenorm")
    assert by_key["train.mask_prob"][2:4] == ("0.25", "(0, 1)")
    assert by_key["data.cache_dir"][2] == "${cramming_cache:}"  # read when composed (config.cache_default)
