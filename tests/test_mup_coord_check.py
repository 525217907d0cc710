"""μP's coordinate check (app/bench/mup/coord_check.py), small: widths 32 to 256 (8x) with the
heads fixed (the head width grows too), four AdamW steps. Under μP no layer kind's activations
grow or shrink with the width; under the standard parametrization the logits and the attention
scores grow. Remove any one of μP's rules (the logits' multiplier, the attention scale, a
hidden group's learning rate) and a kind's line grows: this test fails."""

from __future__ import annotations

import json

import pytest

from app.bench.mup.coord_check import KINDS, CoordSetup, coord_check, slope
from app.bench.mup.figures import plot_coord_check

pytestmark = pytest.mark.integration

SMALL = CoordSetup(
    widths=(32, 64, 128, 256), base_width=32, n_head=2, n_layer=2, steps=4, seeds=(0,),
    batch=4, seq_len=32,
)  # fmt: skip
FLAT = 0.25  # |slope| of log size against log width: at most x1.7 over the 8x range
GROWS = 0.5


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    cache = tmp_path_factory.mktemp("coord")
    return coord_check(SMALL, ["data.builtin_num_docs=300", f"data.cache_dir={cache}"])


def test_under_mup_no_kind_of_activation_moves_with_the_width(report):
    slopes = report["slopes"]["mup"]
    assert set(slopes) == set(KINDS)
    moved = {kind: s for kind, s in slopes.items() if abs(s) > FLAT}
    assert not moved, f"μP's activations move with the width: {moved} (slopes: {slopes})"


def test_under_the_standard_parametrization_the_logits_and_attention_scores_grow(report):
    slopes = report["slopes"]["standard"]
    assert slopes["logits"] > GROWS and slopes["attention logits"] > GROWS, slopes


def test_the_check_writes_its_numbers_and_its_figure(report, tmp_path):
    sizes = report["sizes"]["mup"]["logits"]
    assert len(sizes) == SMALL.steps and all(len(step) == len(SMALL.widths) for step in sizes)
    back = json.loads(json.dumps(report))  # the bench's JSON holds the numbers as they are
    assert back["sizes"] == report["sizes"] and back["slopes"] == report["slopes"]
    png = tmp_path / "coord.png"
    plot_coord_check(report, png)
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.unit
def test_the_slope_is_the_power_of_the_width():
    assert slope((32, 64, 128, 256), [1.0, 1.0, 1.0, 1.0]) == pytest.approx(0.0)
    assert slope((32, 64, 128, 256), [1.0, 2.0, 4.0, 8.0]) == pytest.approx(1.0)
    assert slope((32, 64, 128, 256), [8.0, 4 * 2**0.5, 4.0, 2 * 2**0.5]) == pytest.approx(-0.5)


@pytest.mark.slow
def test_adafactors_relative_step_takes_the_square_root_of_the_width_multiplier(tmp_path):
    """Adafactor's step is relative to the weight's RMS: its hidden rate divided by
    sqrt(width_mult) keeps the check flat (divided by width_mult the hidden layers' outputs
    shrink with the width, undivided they grow: each fails here)."""
    adafactor = CoordSetup(**{**SMALL.__dict__, "optimizer": "adafactor", "lr": 0.01, "steps": 20})
    report = coord_check(adafactor, ["data.builtin_num_docs=300", f"data.cache_dir={tmp_path}"])
    slopes = report["slopes"]["mup"]
    assert all(abs(s) <= FLAT for s in slopes.values()), slopes
