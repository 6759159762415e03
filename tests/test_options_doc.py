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


def test_eval_tasks_lists_every_benchmarks_task_table_and_a_new_one_joins(monkeypatch):
    """The accepted task names come from the benchmarks themselves (their task_table), so a benchmark added in one
    file documents its tasks; a task two benchmarks share says both."""
    from dataclasses import replace

    from cramming.eval.kinds import BENCHMARKS

    mine = replace(BENCHMARKS["glue"], title="Mine", task_table=("alpha", "rte"))

    tasks = options_doc.benchmark_tasks(BENCHMARKS)
    assert {"swag", "race", "race-high", "conll2003", "squad_v2", "axb", "cola"} <= set(tasks)
    assert tasks["rte"] == "a task of eval=glue or superglue."
    monkeypatch.setitem(BENCHMARKS, "mine", mine)
    tasks = options_doc.benchmark_tasks(BENCHMARKS)
    assert tasks["alpha"] == "a task of eval=mine." and tasks["rte"] == "a task of eval=glue, mine or superglue."
    assert "- `alpha`: a task of eval=mine." in options_doc.render()


def test_every_registry_entry_has_its_own_line():
    """Each name an option accepts is explained: its docstring's first sentence or the line it was registered with
    (torch's functions, instances of one class); "et al. 2024" does not end that sentence."""
    for key, (registry, _) in options_doc.components().items():
        about = getattr(registry, "about", {})
        for name in registry:
            line = about.get(name) or options_doc.entry_line(registry[name])
            assert line and line.endswith(".") and len(line) > 12, (key, name, line)
    page = options_doc.render()
    assert "- `muon`: Muon (Jordan et al. 2024:" in page and "- `relu2`: ReLU squared" in page
