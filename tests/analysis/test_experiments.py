"""The synthetic experiments reproduce the papers' claims at reduced size, and the CLI writes its files."""

import json
import math

import numpy as np
import pytest

from attnzoo.analysis import compress, denoise, rank_collapse, save_experiment
from attnzoo.analysis.cli import main as analyze_main
from attnzoo.cli import main as top_main

SMALL_DENOISE = dict(k=3, p=24, n_per=20, delta=0.05, eta=0.2, tau=0.75, layers=6)


def test_denoise_snr_rises_monotonically_at_theorem_rate():
    r = denoise(**SMALL_DENOISE)
    snr = np.asarray(r["snr"]["threshold"])
    assert len(snr) == SMALL_DENOISE["layers"] + 1
    assert np.all(np.diff(snr) > 0), snr
    theory = 1 + 0.2 * 0.75
    assert r["growth_factor_theory"] == pytest.approx(theory)
    assert r["growth_factor_fit"]["threshold"] == pytest.approx(theory, rel=1e-3)
    per_cluster = np.asarray(r["snr_per_cluster"]["threshold"])
    assert per_cluster.shape == (SMALL_DENOISE["layers"] + 1, 3)
    np.testing.assert_allclose(per_cluster[1:] / per_cluster[:-1], theory, rtol=1e-6)
    # soft-max φ also denoises in the first layer (its curve is reported, not asserted beyond that)
    assert r["snr"]["softmax"][1] > r["snr"]["softmax"][0]
    assert r["theorem_conditions"]["satisfied"]["delta"] and r["theorem_conditions"]["satisfied"]["tau"]


def test_compress_coding_rate_falls_and_classes_become_lines():
    r = compress(classes=4, n_per=20, noise=0.1, eps=0.05, kappa=0.9, iterations=120, snapshots=(0, 1, 60))
    rate = np.asarray(r["coding_rate"])
    assert len(rate) == 121
    assert np.all(np.diff(rate) <= 1e-12) and rate[-1] < rate[0] - 1.0
    assert r["line_fit"]["120"] < 0.1 * r["line_fit"]["0"]  # σ₂/σ₁ per class: points collapse onto lines
    assert sorted(r["points"], key=int) == ["0", "1", "60", "120"]
    assert np.asarray(r["points"]["60"]).shape == (80, 3)


def test_rank_collapse_softmax_collapses_csp_does_not():
    r = rank_collapse(depth=6, tokens=16, dim=16, heads=2, batch=2, mechanisms=[])
    soft = np.asarray(r["residual"]["softmax_reference"])
    csp = np.asarray(r["residual"]["csp_reference"])
    assert soft[0] > 0.5 and soft[-1] < 1e-6 * soft[0]  # orders of magnitude (doubly exponential)
    assert np.all(csp > 0.5)  # permutations keep the residual (CSP Theorem 1)
    assert len(r["spectrum"]["csp_reference"]) == 16


def test_rank_collapse_registered_modules():
    """The same experiment through attnzoo.build_attention modules (random Gaussian linear weights)."""
    r = rank_collapse(depth=6, tokens=16, dim=16, heads=2, batch=1, mechanisms=["softmax", "csp", "no-such"])
    assert "no-such" in r["skipped"] and "unknown attention" in r["skipped"]["no-such"]
    soft, csp = np.asarray(r["residual"]["softmax"]), np.asarray(r["residual"]["csp"])
    assert soft[-1] < 1e-6 * soft[0]
    assert csp[-1] > 0.3 * csp[0]


def test_save_experiment_refuses_non_empty_dir_and_writes_atomically(tmp_path):
    r = denoise(**{**SMALL_DENOISE, "layers": 2})
    paths = save_experiment(r, tmp_path / "out", dpi=40)
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(paths["json"].read_text())
    assert data["experiment"] == "denoise" and len(data["snr"]["threshold"]) == 3
    before = paths["json"].read_text()
    with pytest.raises(FileExistsError, match="not empty; pass --overwrite"):
        save_experiment(denoise(**{**SMALL_DENOISE, "layers": 3}), tmp_path / "out", dpi=40)
    assert paths["json"].read_text() == before
    save_experiment(denoise(**{**SMALL_DENOISE, "layers": 3}), tmp_path / "out", overwrite=True, dpi=40)
    assert len(json.loads(paths["json"].read_text())["snr"]["threshold"]) == 4
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["denoise.json", "denoise.png"]  # no temp files


def test_cli_denoise_end_to_end(tmp_path, capsys):
    out = tmp_path / "d"
    argv = [
        "denoise",
        "--out",
        str(out),
        "--k",
        "3",
        "--p",
        "24",
        "--n-per",
        "20",
        "--eta",
        "0.2",
        "--layers",
        "4",
        "--dpi",
        "40",
    ]
    assert analyze_main(argv) == 0
    data = json.loads((out / "denoise.json").read_text())
    assert "snr" in data and len(data["snr"]["threshold"]) == 5
    assert (out / "denoise.png").stat().st_size > 1000
    assert analyze_main(argv) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert analyze_main(argv + ["--overwrite"]) == 0


def test_cli_compress_and_rank_collapse_through_top_level_command(tmp_path):
    assert (
        top_main(
            [
                "analyze",
                "compress",
                "--out",
                str(tmp_path / "c"),
                "--classes",
                "3",
                "--n-per",
                "10",
                "--iterations",
                "20",
                "--snapshots",
                "0,10",
                "--kappa",
                "0.5",
                "--dpi",
                "40",
            ]
        )
        == 0
    )
    data = json.loads((tmp_path / "c" / "compress.json").read_text())
    assert data["coding_rate"][-1] < data["coding_rate"][0]
    assert (tmp_path / "c" / "compress.png").exists()
    assert (
        top_main(
            [
                "analyze",
                "rank-collapse",
                "--out",
                str(tmp_path / "r"),
                "--depth",
                "3",
                "--tokens",
                "8",
                "--dim",
                "8",
                "--heads",
                "2",
                "--mechanisms",
                "none",
                "--dpi",
                "40",
            ]
        )
        == 0
    )
    data = json.loads((tmp_path / "r" / "rank-collapse.json").read_text())
    assert set(data["residual"]) == {"softmax_reference", "csp_reference"}
    assert all(math.isfinite(v) for v in data["residual"]["softmax_reference"])


def test_cli_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):
        analyze_main(["no-such-experiment", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        analyze_main(["layerwise", "--out", str(tmp_path / "x")])  # needs --checkpoint or --model
    assert "exactly one of --checkpoint DIR or --model NAME" in capsys.readouterr().err
    (tmp_path / "f").write_text("x")
    assert analyze_main(["denoise", "--out", str(tmp_path / "f")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert analyze_main(["denoise", "--out", str(tmp_path / "y"), "--layers", "0"]) == 2
    assert "layers must be a positive integer" in capsys.readouterr().err
