"""``attnzoo models`` and scripts/models_table.py (the README table generated from the registry)."""

import importlib.util
from pathlib import Path

import pytest

from attnzoo.cli import main as attnzoo_main
from attnzoo.layers import list_attentions as attnzoo_list_attentions
from attnzoo.models import count_parameters, list_models
from attnzoo.models.cli import main, models_table_markdown

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "models_table.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("models_table", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_markdown_table_lists_every_model(capsys):
    assert main(["--markdown"]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert lines[0] == "| Model | Paper | Params | Paper figure | Attention |"
    assert len(lines) == 2 + len(list_models())
    for name in list_models():
        assert f"| `{name}` |" in out
    row = next(line for line in lines if line.startswith("| `tost_s` |"))
    assert f"{count_parameters('tost_s') / 1e6:.2f}M" in row and "tssa" in row and "ToST Table 5" in row


def test_listing_with_pattern_via_top_level_cli(capsys):
    assert attnzoo_main(["models", "cbt_*"]) == 0
    out = capsys.readouterr().out
    assert "cbt_s" in out and "6.67M" in out and "vit_s" not in out
    assert main(["nothing_matches_*"]) == 2
    assert "no model matches" in capsys.readouterr().err


def test_script_prints_and_updates(tmp_path, capsys):
    mod = _load_script()
    assert mod.main(["--pattern", "aot_*"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == models_table_markdown("aot_*")
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{mod.BEGIN}\nold table\n{mod.END}\n\ntail\n")
    assert mod.main(["--update", str(readme), "--pattern", "aot_*"]) == 0
    text = readme.read_text()
    assert "old table" not in text and printed in text and text.endswith("tail\n") and text.startswith("# x\n")
    bad = tmp_path / "BAD.md"
    bad.write_text("no markers\n")
    with pytest.raises(SystemExit, match="marker"):
        mod.main(["--update", str(bad)])
    assert bad.read_text() == "no markers\n"


def test_readme_models_table_is_current():
    """The README's table is generated (scripts/models_table.py --update README.md); stale counts fail here."""
    mod = _load_script()
    text = (SCRIPT.parents[1] / "README.md").read_text(encoding="utf-8")
    section = text.split(mod.BEGIN, 1)[1].split(mod.END, 1)[0].strip()
    assert section == models_table_markdown().strip(), "run: python scripts/models_table.py --update README.md"


def test_readme_mechanisms_table_is_current():
    """The README's mechanisms table is generated from each mechanism's Mechanism.card (scripts/models_table.py)."""
    from attnzoo.layers._table import mechanisms_table_markdown

    mod = _load_script()
    text = (SCRIPT.parents[1] / "README.md").read_text(encoding="utf-8")
    section = text.split(mod.MECHANISMS_BEGIN, 1)[1].split(mod.MECHANISMS_END, 1)[0].strip()
    assert section == mechanisms_table_markdown().strip(), "run: python scripts/models_table.py --update README.md"
    for name in attnzoo_list_attentions():
        assert f"| `{name}` |" in section


def test_script_updates_the_mechanisms_table_where_marked(tmp_path, capsys):
    from attnzoo.layers._table import mechanisms_table_markdown

    mod = _load_script()
    assert mod.main(["--mechanisms"]) == 0
    assert capsys.readouterr().out.strip() == mechanisms_table_markdown()
    readme = tmp_path / "README.md"
    readme.write_text(f"{mod.MECHANISMS_BEGIN}\nold\n{mod.MECHANISMS_END}\n\n{mod.BEGIN}\nold\n{mod.END}\n")
    assert mod.main(["--update", str(readme), "--pattern", "aot_*"]) == 0
    text = readme.read_text()
    assert "old" not in text and mechanisms_table_markdown() in text and models_table_markdown("aot_*") in text
