"""The dashboard's display transforms, without Streamlit: exact bytes stay in the frame (and its CSV), units sit
beside them, every table's styler formats the same way."""

import pandas as pd

from analyzer.fmt import MIB
from analyzer.report import frames


def test_with_units_adds_mib_beside_the_exact_bytes():
    f = pd.DataFrame({"op": ["tile"], "output_bytes": [16 * MIB]})
    out = frames.with_units(f, ["output_bytes"], mb=True)
    assert list(out.columns) == ["op", "output_bytes", "output_bytes MiB", "output_bytes MB"]
    assert out["output_bytes"].iloc[0] == 16 * MIB and out["output_bytes MiB"].iloc[0] == 16.0
    assert abs(out["output_bytes MB"].iloc[0] - 16.777216) < 1e-9


def test_category_display_picks_the_unit_the_largest_value_reads_best_in():
    cats = pd.DataFrame({"category": ["kv_replication", "total"], "a_bytes": [960 * MIB, 4000 * MIB],
                         "b_bytes": [0, 3040 * MIB], "delta_bytes": [-960 * MIB, -960 * MIB]})
    out = frames.category_display(cats)
    assert list(out.columns) == ["category", "A MiB", "B MiB", "Δ MiB", "A MB", "B MB", "Δ MB"]
    assert out["A MiB"].tolist() == [960.0, 4000.0]  # 4000 MiB reads as ≥ 100 MiB, not 3.9 GiB
    tiny = frames.category_display(cats.assign(a_bytes=[102_400, 409_600], b_bytes=[0, 307_200],
                                               delta_bytes=[-102_400, -102_400]))
    assert tiny["A KiB"].tolist() == [100.0, 400.0]


def test_styled_formats_numbers_and_blanks_missing_cells():
    f = pd.DataFrame({"n": [1234567], "x MiB": [12.345], "ratio": [-0.0001], "note": [None]})
    html = frames.styled(f).to_html()
    assert "1,234,567" in html and "12.3" in html and "-0.00" not in html and "None" not in html
    big = pd.DataFrame({"v": range(frames.MAX_STYLED_CELLS + 1)})
    assert frames.styled(big) is big  # too large to style: shown as it is


def test_frame_csv_escapes_formula_like_cells_and_keeps_exact_integers():
    f = pd.DataFrame({"label": ["=HYPERLINK(\"http://x\")"], "bytes": [2_013_265_920]})
    text = frames.frame_csv(f)
    assert "2013265920" in text and "\n=HYPERLINK" not in text


def test_metric_width_fits_the_widest_value():
    narrow = frames.metric_width_px(["1.0"])
    wide = frames.metric_width_px(["2,521 → 2,401 MiB per token"])
    assert narrow == 220 and wide > narrow
